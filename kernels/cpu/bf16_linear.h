// Projections with bf16 weights on the CPU, through oneDNN's matmul (its brgemm kernels use
// AVX512-BF16, and AMX where the CPU has it): the weights are rounded once and packed into the
// blocked layout oneDNN's kernels read, the activations are rounded per call, and every sum is
// float32. Measured here (2 threads, bf16, 1376x512): oneDNN reached 400 GFLOP/s on 512-token
// products where a hand-written AVX512-BF16 tile kernel reached 100, and streamed cold weights at
// 20-24 GB/s for 1 to 8 tokens. The ops.h `linear` contract, for a Bf16Matrix.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/cpu/onednn.h"
#include "model/model.h"

namespace fpa::cpu {

class ThreadPool;

// Whether this CPU has the AVX512-BF16 dot product (checked at run time: the same build runs
// on CPUs without it, in float32).
bool cpu_has_bf16();

// A weight matrix [rows, cols] packed for oneDNN: its bf16 bits as the model holds them, else
// rounded to bf16 (nearest even) from float32.
class Bf16Matrix {
 public:
  explicit Bf16Matrix(const Matrix& m);
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  const dnnl::memory& packed() const { return packed_.mem; }
  // Where oneDNN packed 64 outputs by pairs of inputs (its AVX512-BF16 layout): the start of
  // each block of 64 outputs, `block` values apart; 0 for any other layout.
  long block() const { return block_; }

 private:
  int rows_, cols_;
  PackedWeights packed_;
  long block_ = 0;
};

// y[n, w.rows()] (+)= x[n, w.cols()] * w^T on the pool's threads (OpenMP's, which oneDNN and the
// pool share). Requires cpu_has_bf16().
void linear_bf16(const float* x, int n, const Bf16Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate = false);

}  // namespace fpa::cpu
