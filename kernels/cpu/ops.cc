#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/parallel.h"

namespace fpa::cpu {

void use_single_threaded_blas() { openblas_set_num_threads(1); }

void linear(const float* x, int n, const Matrix& w, float* y, ThreadPool* pool, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  for_row_blocks(pool, w.rows, static_cast<long>(n) * w.rows * w.cols, [&](int r0, int rows) {
    const float* wb = w.data + static_cast<long>(r0) * w.cols;
    if (n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, w.cols, 1.0f, wb, w.cols, x, 1, beta, y + r0,
                  1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, w.cols, 1.0f, x, w.cols, wb,
                  w.cols, beta, y + r0, w.rows);
    }
  });
}

namespace {

// The sum of squares of x[0, d): in four vectors of 16 lanes, then a tail. A float sum is not
// reordered without -ffast-math, so the plain loop was one chain of adds, each waiting on the
// last: a batch-32 step's norms took 1.1% of it (perf, bench/RESULTS.md, ninth session).
float sum_of_squares(const float* x, int d) {
  Lanes s[4] = {};
  int i = 0;
  for (; i + 64 <= d; i += 64) {
    for (int k = 0; k < 4; ++k) s[k] += load(x + i + 16 * k) * load(x + i + 16 * k);
  }
  for (; i + 16 <= d; i += 16) s[0] += load(x + i) * load(x + i);
  float ss = hsum((s[0] + s[1]) + (s[2] + s[3]));
  for (; i < d; ++i) ss += x[i] * x[i];
  return ss;
}

}  // namespace

void rmsnorm(const float* x, int n, std::span<const float> weight, float eps, float* y) {
  const int d = static_cast<int>(weight.size());
  for (int t = 0; t < n; ++t) {
    const float* xr = x + static_cast<long>(t) * d;
    float* yr = y + static_cast<long>(t) * d;
    const float ss = sum_of_squares(xr, d);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void swiglu(float* gate, const float* up, long count) {
  long i = 0;
  for (; i + 16 <= count; i += 16) store(gate + i, silu_lanes(load(gate + i)) * load(up + i));
  for (; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void rope(float* x, int count, int stride, int dim, int pos, float theta) {
  const int half = dim / 2;
  // The angles first, then each head along i: the loop over heads inside the one over i read
  // every head's pair `stride` floats apart, one lane at a time.
  thread_local std::vector<float> cs;
  cs.resize(2 * static_cast<size_t>(half));
  float* const c = cs.data();
  float* const s = c + half;
  for (int i = 0; i < half; ++i) {
    // float32 angle as the reference computes it: pos * theta^(-2i/dim).
    const float inv_freq =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float angle = static_cast<float>(pos) * inv_freq;
    c[i] = std::cos(angle), s[i] = std::sin(angle);
  }
  for (int h = 0; h < count; ++h) {
    float* v = x + static_cast<long>(h) * stride;
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

float log_sigmoid(float x) { return std::min(x, 0.0f) - std::log1p(std::exp(-std::fabs(x))); }

}  // namespace fpa::cpu
