// Projections with int8 weights on the CPU (issue 26): a quarter of float32's bytes per decode
// step. Weights are symmetric per output row, w[r, :] ~ scale[r] * q[r, :] with q in [-127, 127],
// quantized once at load (or read as the file stores them, docs/model-format.md). Activations
// are quantized the same way per token at every call, as llama.cpp's Q8_0 x Q8_0 does, and held
// as unsigned bytes q + 128: AVX512-VNNI's vpdpbusd multiplies unsigned by signed bytes (this
// CPU family has no signed-by-signed form), and the 128 * sum(q[r, :]) it adds is taken back
// out exactly. Sums are int32. 1 to kInt8GemvTokens tokens go through a hand-written kernel that
// streams oneDNN's packed weights (with AMX tiles where the CPU has them, int8_amx.h); more
// through oneDNN's u8 x s8 matmul on the same copy.
#pragma once

#include <cstdint>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <span>
#include <vector>

#include "kernels/cpu/onednn.h"
#include "model/model.h"

namespace fpa::cpu {

class ThreadPool;

// Whether this CPU has AVX512-VNNI (checked at run time, as cpu_has_bf16).
bool cpu_has_vnni();

// Symmetric per-row quantization of float32 weights: returns the row's scale (its largest
// magnitude / 127; 1 for a zero row) and writes round(w / scale) to q. The file writer
// (train/quantize_int8.py) quantizes the same way.
float quantize_row(const float* w, int cols, int8_t* q);

class Int8Matrix {
 public:
  // From the file's int8 values and scales where the model kept them, else quantized from its
  // float32 or bf16 values.
  explicit Int8Matrix(const Matrix& m);
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  const dnnl::memory& packed() const { return packed_.mem; }
  // oneDNN's VNNI layout (64 outputs by quads of inputs): the distance between blocks of 64
  // outputs; 0 for any other layout (then every product goes through oneDNN).
  long block() const { return block_; }
  const float* scale() const { return scale_.data(); }
  const int32_t* offset() const { return offset_.data(); }  // 128 * sum(q[r, :])

 private:
  int rows_, cols_;
  std::vector<float> scale_;
  std::vector<int32_t> offset_;
  PackedWeights packed_;
  long block_ = 0;
};

// Token counts the hand-written kernel takes by default; oneDNN's brgemm takes more. Measured
// (build/bench/fpa-linear-bench, int8 with this limit raised against int8-onednn, 5632 x 2048
// weights past the LLC, AMD EPYC, 2026-12-06; bench/RESULTS.md), three runs: the kernel ahead
// by 13-18% at 64 tokens and 1-9% at 96, -4 to +7% at 128, behind by 0-7% at 160-192 and 3-10%
// at 256.
inline constexpr int kInt8GemvTokens = 128;
// Token counts from which the hand-written kernel multiplies with AMX tiles where the CPU has them
// (int8_amx.h), not vpdpbusd. Measured (fpa-linear-bench, int8 against int8-vnni, 5632 x 2048
// weights past the LLC, Intel Xeon model 207, 2026-12-06; bench/RESULTS.md), two runs: the tiles
// 1.0-1.1x at 2 tokens, 1.1-1.3x at 4-16, 0.9-1.3x at 24-32, 1.7-2.6x at 48-128.
inline constexpr int kInt8AmxTokens = 2;

// Which kernel takes n tokens: the hand-written one up to gemv_tokens (more go through oneDNN's
// matmul), with AMX tiles from amx_tokens on.
struct Int8Route {
  int gemv_tokens = kInt8GemvTokens;
  int amx_tokens = kInt8AmxTokens;
};
// The hand-written kernel without AMX tiles at any token count (vpdpbusd only).
inline constexpr Int8Route kInt8NoTiles{.amx_tokens = std::numeric_limits<int>::max()};

// y[n, w.rows()] (+)= x[n, w.cols()] * w^T, the activations quantized per token. Requires
// cpu_has_vnni().
void linear_int8(const float* x, int n, const Int8Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate = false, Int8Route route = {});

// One product of linear_int8's with its output.
struct Int8Output {
  const Int8Matrix* w;
  float* y;
  bool accumulate = false;
};

// linear_int8 of one input against several matrices of its width (a layer's q, k and v; gate and
// up): through the hand-written kernel the input is quantized once and all the matrices' blocks
// go out in one pass over the pool, so the threads wait for each other once, not per matrix.
void linear_int8(const float* x, int n, std::span<const Int8Output> outs, ThreadPool* pool,
                 Int8Route route = {});

}  // namespace fpa::cpu
