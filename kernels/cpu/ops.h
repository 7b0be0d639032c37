// Dense CPU kernels of the decoder: projections (BLAS), RMSNorm, SwiGLU, RoPE, the field's
// scalar functions. Row-major activations [n_tokens, width].
#pragma once

#include <span>

#include "model/model.h"

namespace fpa::cpu {

class ThreadPool;

// y[n, w.rows] (+)= x[n, w.cols] * w^T, split over the pool (if any) by blocks of w's rows.
void linear(const float* x, int n, const Matrix& w, float* y, ThreadPool* pool,
            bool accumulate = false);

// y = x / sqrt(mean(x^2) + eps) * weight, per row of width weight.size().
void rmsnorm(const float* x, int n, std::span<const float> weight, float eps, float* y);

// gate = silu(gate) * up, elementwise over `count` values.
void swiglu(float* gate, const float* up, long count);

// Rotate-half RoPE (GPT-NeoX pairing (i, i + dim/2)) at position `pos` of `count` head vectors
// of `dim` floats, `stride` floats apart: a token's heads share the angles, computed once.
void rope(float* x, int count, int stride, int dim, int pos, float theta);

// log(sigmoid(x)) without overflow, as torch.nn.functional.logsigmoid.
float log_sigmoid(float x);

}  // namespace fpa::cpu
