#include "kernels/cpu/bf16_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/cpu/parallel.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

constexpr int kLanes = 32;  // bf16 values in one 512-bit register

int padded(int cols) { return (cols + kLanes - 1) / kLanes * kLanes; }

// The AVX-512 code is compiled for its target whatever -march says, and runs only where
// cpu_has_bf16(). Registers are reinterpreted with GCC vector casts: std::bit_cast would be a
// function passing 512-bit vectors outside that target (another ABI).
#define FPA_BF16_TARGET [[gnu::target("avx512f,avx512bw,avx512bf16")]]

// x[n, cols] -> bf16 rows of `stride` (zero-padded), 32 values per conversion.
FPA_BF16_TARGET void convert_rows(const float* x, int n, int cols, int stride, uint16_t* out) {
  for (int t = 0; t < n; ++t) {
    const float* row = x + static_cast<long>(t) * cols;
    uint16_t* dst = out + static_cast<long>(t) * stride;
    for (int c = 0; c < stride; c += kLanes) {
      const int lo = std::clamp(cols - c, 0, 16), hi = std::clamp(cols - c - 16, 0, 16);
      const __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lo) - 1), row + c);
      const __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << hi) - 1), row + c + 16);
      _mm512_storeu_si512(dst + c, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

// The sum of 16 lanes, once per output value. (GCC 12's _mm512_reduce_add_ps trips its own
// -Wuninitialized.)
FPA_BF16_TARGET inline float sum_lanes(__m512 v) {
  alignas(64) float f[16];
  _mm512_store_ps(f, v);
  float s = 0.0f;
  for (float x : f) s += x;
  return s;
}

// The two 256-bit halves of a register, added (vector shuffles: the intrinsics trip
// -Wuninitialized).
FPA_BF16_TARGET inline __m256 add_halves(__m512 v) {
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}

// The sums of four accumulators at once, for four adjacent outputs: a dot product over a short
// row (d_model 160 is five chunks) costs about as much as reducing it one lane at a time.
FPA_BF16_TARGET inline __m128 sum_lanes4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 ab = _mm256_hadd_ps(add_halves(a), add_halves(b));
  const __m256 cd = _mm256_hadd_ps(add_halves(c), add_halves(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // per 128-bit half: a, b, c, d partial sums
  return __builtin_shufflevector(abcd, abcd, 0, 1, 2, 3) +
         __builtin_shufflevector(abcd, abcd, 4, 5, 6, 7);
}

// R weight rows against T tokens: every weight load feeds T dot products, every token load R.
template <int R, int T>
FPA_BF16_TARGET inline void tile(const uint16_t* w, int stride, const uint16_t* x, float* y,
                                 int y_stride, bool accumulate) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (int c = 0; c < stride; c += kLanes) {
    __m512bh xv[T];
    for (int t = 0; t < T; ++t) {
      xv[t] = (__m512bh)(_mm512_loadu_si512(x + static_cast<long>(t) * stride + c));
    }
    for (int r = 0; r < R; ++r) {
      // The next tile's rows, asked for ahead: at batch 1 the product streams the weights from
      // memory, and the hardware prefetcher alone left 10-35% of the bandwidth unused.
      __builtin_prefetch(w + static_cast<long>(R + r) * stride + c);
      const __m512bh wv = (__m512bh)(_mm512_loadu_si512(w + static_cast<long>(r) * stride + c));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* out = y + static_cast<long>(t) * y_stride;
    if constexpr (R == 4) {
      __m128 s = sum_lanes4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
      if (accumulate) s = _mm_add_ps(s, _mm_loadu_ps(out));
      _mm_storeu_ps(out, s);
    } else {
      for (int r = 0; r < R; ++r) {
        const float s = sum_lanes(acc[r][t]);
        out[r] = accumulate ? out[r] + s : s;
      }
    }
  }
}

template <int R>
FPA_BF16_TARGET void tile_tokens(int tokens, const uint16_t* w, int stride, const uint16_t* x,
                                 float* y, int y_stride, bool accumulate) {
  switch (tokens) {
    case 1:
      return tile<R, 1>(w, stride, x, y, y_stride, accumulate);
    case 2:
      return tile<R, 2>(w, stride, x, y, y_stride, accumulate);
    case 3:
      return tile<R, 3>(w, stride, x, y, y_stride, accumulate);
    default:
      return tile<R, 4>(w, stride, x, y, y_stride, accumulate);
  }
}

// Rows [r0, r0 + rows) of y for every token, four tokens and four rows at a time.
FPA_BF16_TARGET void rows_block(const Bf16Matrix& w, int r0, int rows, const uint16_t* x, int n,
                                float* y, bool accumulate) {
  for (int t0 = 0; t0 < n; t0 += 4) {
    const int tokens = std::min(4, n - t0);
    const uint16_t* xt = x + static_cast<long>(t0) * w.stride;
    float* yt = y + static_cast<long>(t0) * w.rows;
    int r = r0;
    for (; r + 4 <= r0 + rows; r += 4) {
      tile_tokens<4>(tokens, w.bits.data() + static_cast<long>(r) * w.stride, w.stride, xt, yt + r,
                     w.rows, accumulate);
    }
    for (; r < r0 + rows; ++r) {
      tile_tokens<1>(tokens, w.bits.data() + static_cast<long>(r) * w.stride, w.stride, xt, yt + r,
                     w.rows, accumulate);
    }
  }
}

// Per-thread bf16 activations.
uint16_t* scratch(size_t n) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

bool cpu_has_bf16() { return __builtin_cpu_supports("avx512bf16"); }

Bf16Matrix to_bf16(const Matrix& m) {
  Bf16Matrix out{{}, m.rows, m.cols, padded(m.cols)};
  out.bits.assign(static_cast<size_t>(m.rows) * out.stride, 0);
  for (int r = 0; r < m.rows; ++r) {
    for (int c = 0; c < m.cols; ++c) {
      out.bits[static_cast<size_t>(r) * out.stride + c] =
          round_to_bf16(m.data[static_cast<long>(r) * m.cols + c]);
    }
  }
  return out;
}

void linear_bf16(const float* x, int n, const Bf16Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate) {
  uint16_t* xb = scratch(static_cast<size_t>(n) * w.stride);
  convert_rows(x, n, w.cols, w.stride, xb);
  for_row_blocks(pool, w.rows, static_cast<long>(n) * w.rows * w.cols,
                 [&](int r0, int rows) { rows_block(w, r0, rows, xb, n, y, accumulate); });
}

}  // namespace fpa::cpu
