// Projections with bf16 weights on the CPU: the weights are rounded once (half the bytes a decode
// step reads from memory, where a batch-1 step is bound by them), the activations per call, and
// every sum is float32 (AVX512-BF16 dot products). The ops.h `linear` contract, for a Bf16Matrix.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace fpa::cpu {

class ThreadPool;

// Whether this CPU has the AVX512-BF16 dot product (checked at run time: the same build runs
// on CPUs without it, in float32).
bool cpu_has_bf16();

// A weight matrix [rows, cols] as bf16 bits, each row zero-padded to a multiple of 32 columns
// (one 512-bit load), rounded to nearest even from the model's float32.
struct Bf16Matrix {
  std::vector<uint16_t> bits;
  int rows = 0;
  int cols = 0;
  int stride = 0;  // cols rounded up to 32
};

Bf16Matrix to_bf16(const Matrix& m);

// y[n, w.rows] (+)= x[n, w.cols] * w^T, split over the pool by blocks of w's rows. Requires
// cpu_has_bf16().
void linear_bf16(const float* x, int n, const Bf16Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate = false);

}  // namespace fpa::cpu
