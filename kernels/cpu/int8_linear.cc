#include "kernels/cpu/int8_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/cpu/onednn.h"
#include "kernels/cpu/parallel.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

constexpr int kTile = 4;  // tokens per pass over a block: 4 x 4 accumulators + 4 weight registers

// As in bf16_linear.cc: compiled for its target whatever -march says, run only where
// cpu_has_vnni().
#define FPA_VNNI_TARGET [[gnu::target("avx512f,avx512bw,avx512vnni")]]

__mmask16 first(int lanes) { return static_cast<__mmask16>((1u << std::clamp(lanes, 0, 16)) - 1); }

// x[n, cols] -> per token a scale sx[t] and bytes round(x / sx) + 128, rows `stride` apart,
// 128 (zero) from cols to stride.
FPA_VNNI_TARGET void quantize_tokens(const float* x, int n, int cols, int stride, uint8_t* out,
                                     float* sx) {
  for (int t = 0; t < n; ++t) {
    const float* xr = x + static_cast<long>(t) * cols;
    __m512 amax = _mm512_setzero_ps();
    for (int c = 0; c < cols; c += 16) {
      // maskz: GCC 12's plain max_ps reads an undefined register it then warns about.
      const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(first(cols - c), xr + c));
      amax = _mm512_maskz_max_ps(0xffff, amax, v);
    }
    // Reduced through memory: GCC 12 warns that reduce_max_ps reads an uninitialized register.
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, amax);
    const float m = *std::max_element(lanes, lanes + 16);
    sx[t] = m > 0 ? m / 127.0f : 1.0f;
    const __m512 inv = _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f);
    uint8_t* row = out + static_cast<long>(t) * stride;
    for (int c = 0; c < cols; c += 16) {
      const __mmask16 k = first(cols - c);
      const __m512i q =
          _mm512_maskz_cvtps_epi32(k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + c), inv));
      _mm512_mask_cvtusepi32_storeu_epi8(row + c, k, _mm512_add_epi32(q, _mm512_set1_epi32(128)));
    }
    std::memset(row + cols, 128, stride - cols);
  }
}

// y[0, count) (+)= (acc - offset) * scale * sx: int32 sums back to float32 outputs.
FPA_VNNI_TARGET void dequantize(const int32_t* acc, int count, const int32_t* offset,
                                const float* scale, float sx, float* y, bool accumulate) {
  const __m512 s = _mm512_set1_ps(sx);
  for (int c = 0; c < count; c += 16) {
    const __mmask16 k = first(count - c);
    const __m512i a = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(k, acc + c),
                                       _mm512_maskz_loadu_epi32(k, offset + c));
    __m512 v = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(k, a), _mm512_maskz_loadu_ps(k, scale + c)), s);
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, y + c));
    _mm512_mask_storeu_ps(y + c, k, v);
  }
}

// What a pass over one block prefetches: per quad q the lines at from + q * step and `second`
// bytes past it (0: one line). A block read by one token tile streams its own lines 2 KiB ahead
// (the prefetcher alone lags). Read by several, the block is in L2 after the first pass: every
// pass then pulls its share of the NEXT block's lines (tile i of n: from line i * 4 * quads / n,
// ceil(4 / n) lines a quad, so the shares cover the block; for n = 3 and n > 4 they overlap, and a
// line asked for again is found in the cache), so DRAM streams while the passes compute; else it
// idles through the passes that re-read the block. The same two prefetches either way: no branch
// or division per quad.
struct Ahead {
  const int8_t* from;
  int step, second;
};

Ahead ahead_of(const int8_t* block, const int8_t* next, int quads, int tile, int tiles) {
  if (next == nullptr) return {block + 2048, 256, 0};
  const int per = (4 + tiles - 1) / tiles;  // lines per quad, 2 at most for tiles >= 2
  return {next + 64L * (4L * tile * quads / tiles), 64 * per, per > 1 ? 64 : 0};
}

// acc += the products of x's unsigned and w's signed bytes, 4 per int32 lane. The intrinsic, in
// GCC 12, copied every accumulator into a new register and back on every quad (and spilled one
// to the stack: a store-to-load chain per quad); the instruction accumulates in place, and this
// kernel ran 1.3x faster from the cache for 4 and 8 tokens (bench/RESULTS.md).
FPA_VNNI_TARGET [[gnu::always_inline]] inline __m512i dpbusd(__m512i acc, __m512i x, __m512i w) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
  return acc;
}

// T tokens (rows of x `stride` bytes apart) against one block of 64 outputs in oneDNN's VNNI
// layout: per quad of inputs, 64 outputs x 4 inputs are four registers, each a vpdpbusd step of
// 16 outputs with a token's quad broadcast. acc[t] gets the block's 64 int32 sums.
template <int T>
FPA_VNNI_TARGET void dot_block_tokens(const int8_t* wb, int quads, const uint8_t* x, int stride,
                                      Ahead ahead, int32_t (*acc)[64]) {
  __m512i a[T][4];
  for (auto& row : a) {
    for (__m512i& v : row) v = _mm512_setzero_si512();
  }
  for (int q = 0; q < quads; ++q) {
    const int8_t* wq = wb + q * 256;
    const int8_t* line = ahead.from + static_cast<long>(q) * ahead.step;
    __builtin_prefetch(line);
    __builtin_prefetch(line + ahead.second);
    __m512i w[4];
    for (int j = 0; j < 4; ++j) w[j] = _mm512_loadu_si512(wq + 64 * j);
    for (int t = 0; t < T; ++t) {
      uint32_t quad;
      std::memcpy(&quad, x + static_cast<long>(t) * stride + 4 * q, sizeof quad);
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(quad));
      for (int j = 0; j < 4; ++j) a[t][j] = dpbusd(a[t][j], xv, w[j]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < 4; ++j) _mm512_storeu_si512(acc[t] + 16 * j, a[t][j]);
  }
}

using DotFn = void (*)(const int8_t*, int, const uint8_t*, int, Ahead, int32_t (*)[64]);
constexpr std::array<DotFn, kTile> kDot = {&dot_block_tokens<1>, &dot_block_tokens<2>,
                                           &dot_block_tokens<3>, &dot_block_tokens<4>};

// A few tokens against blocks [b0, b1): each block streamed once from memory, its
// token tiles reading it again from the L1/L2 cache.
void gemv_blocks(const Int8Matrix& w, const uint8_t* x, const float* sx, int n, float* y, int b0,
                 int b1, bool accumulate) {
  const auto* bits = static_cast<const int8_t*>(w.packed().get_data_handle());
  const int stride = static_cast<int>(w.block() / 64);
  const int tiles = (n + kTile - 1) / kTile;
  for (int b = b0; b < b1; ++b) {
    const int n0 = b * 64, count = std::min(64, w.rows() - n0);
    for (int t0 = 0; t0 < n; t0 += kTile) {
      const int tile = std::min(kTile, n - t0);
      const int8_t* block = bits + b * w.block();
      const int8_t* next = tiles > 1 && b + 1 < b1 ? block + w.block() : nullptr;
      int32_t acc[kTile][64];
      kDot[tile - 1](block, stride / 4, x + static_cast<long>(t0) * stride, stride,
                     ahead_of(block, next, stride / 4, t0 / kTile, tiles), acc);
      for (int t = 0; t < tile; ++t) {
        dequantize(acc[t], count, w.offset() + n0, w.scale() + n0, sx[t0 + t],
                   y + static_cast<long>(t0 + t) * w.rows() + n0, accumulate);
      }
    }
  }
}

template <class T>
T* scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Weights given as float32 or bf16 rows, quantized per row into q; their scales.
std::vector<float> quantize_matrix(const Matrix& m, int8_t* q) {
  std::vector<float> scale(m.rows), row(m.cols);
  for (int r = 0; r < m.rows; ++r) {
    const size_t at = static_cast<size_t>(r) * m.cols;
    if (m.data != nullptr) {
      std::copy(m.data + at, m.data + at + m.cols, row.begin());
    } else {
      std::transform(m.bf16 + at, m.bf16 + at + m.cols, row.begin(), bf16_to_float);
    }
    scale[r] = quantize_row(row.data(), m.cols, q + at);
  }
  return scale;
}

// Whether the hand-written kernel takes every output, on one quantized copy of the input: each
// in the VNNI block layout, all with the same padded input length.
bool gemv_fits(std::span<const Int8Output> outs) {
  return std::all_of(outs.begin(), outs.end(), [&](const Int8Output& o) {
    return o.w->block() > 0 && o.w->block() == outs[0].w->block() &&
           o.w->cols() == outs[0].w->cols();
  });
}

// x[n, cols] quantized as quantize_tokens does (rows `stride` apart), blocks of tokens on the
// pool: serial, each of a prompt chunk's quantizations kept the pool's other thread waiting.
void quantize_rows(const float* x, int n, int cols, int stride, uint8_t* out, float* sx,
                   ThreadPool* pool) {
  for_token_rows(pool, n, static_cast<long>(n) * cols, [&](int r0, int rows) {
    quantize_tokens(x + static_cast<long>(r0) * cols, rows, cols, stride,
                    out + static_cast<long>(r0) * stride, sx + r0);
  });
}

// 1 to gemv_tokens tokens: the hand-written kernel over the packed blocks, every output's blocks
// numbered one after another and shared out in one pass over the pool.
void gemv(const float* x, int n, std::span<const Int8Output> outs, ThreadPool* pool) {
  const Int8Matrix& w0 = *outs[0].w;
  float* sx = scratch<float>(n);
  const int stride = static_cast<int>(w0.block() / 64);
  uint8_t* xq = scratch<uint8_t>(static_cast<size_t>(n) * stride);
  quantize_rows(x, n, w0.cols(), stride, xq, sx, pool);
  long rows = 0;
  for (const Int8Output& o : outs) rows += (o.w->rows() + 63) / 64 * 64;
  // One pass per block (up to kTile tokens) streams each block on its own, so the ranges may
  // shrink to a block at the end and the threads finish together (at 1 token a few per cent,
  // bench/RESULTS.md); more passes fetch a range's next block during this one's and want long
  // ranges.
  const auto range = [&](int b0, int b1) {
    int first = 0;  // the output's first block in the joint numbering
    for (const Int8Output& o : outs) {
      const int blocks = (o.w->rows() + 63) / 64;
      const int lo = std::max(b0 - first, 0), hi = std::min(b1 - first, blocks);
      if (lo < hi) gemv_blocks(*o.w, xq, sx, n, o.y, lo, hi, o.accumulate);
      first += blocks;
    }
  };
  for_output_blocks(pool, static_cast<int>(rows), n * rows * w0.cols(), range, n <= kTile);
}

// More tokens: oneDNN's u8 x s8 -> s32 matmul of the quantized input (xq, sx: quantize_rows),
// then the sums dequantized per token.
void onednn_product(const uint8_t* xq, const float* sx, int n, const Int8Matrix& w, float* y,
                    ThreadPool* pool, bool accumulate) {
  int32_t* acc = scratch<int32_t>(static_cast<size_t>(n) * w.rows());
  const dnnl::engine& e = onednn_engine();
  run_matmul(matmul(w.packed(), w.rows(), w.cols(), n, Dt::u8, Dt::s32, false),
             memory(rows_desc(n, w.cols(), Dt::u8), e, const_cast<uint8_t*>(xq)), w.packed(),
             memory(rows_desc(n, w.rows(), Dt::s32), e, acc), pool);
  parallel_for(pool, n, static_cast<long>(n) * w.rows(), [&](int t) {
    const long at = static_cast<long>(t) * w.rows();
    dequantize(acc + at, w.rows(), w.offset(), w.scale(), sx[t], y + at, accumulate);
  });
}

}  // namespace

bool cpu_has_vnni() { return __builtin_cpu_supports("avx512vnni"); }

float quantize_row(const float* w, int cols, int8_t* q) {
  float m = 0.0f;
  for (int c = 0; c < cols; ++c) m = std::max(m, std::fabs(w[c]));
  const float scale = m > 0 ? m / 127.0f : 1.0f;
  for (int c = 0; c < cols; ++c) {
    q[c] = static_cast<int8_t>(std::clamp(std::nearbyint(w[c] / scale), -127.0f, 127.0f));
  }
  return scale;
}

Int8Matrix::Int8Matrix(const Matrix& m) : rows_(m.rows), cols_(m.cols) {
  std::vector<int8_t> quantized;
  const int8_t* q = m.i8;  // as the file stores them, else quantized here
  if (q != nullptr) {
    scale_.assign(m.scale, m.scale + m.rows);
  } else {
    quantized.resize(static_cast<size_t>(m.rows) * m.cols);
    scale_ = quantize_matrix(m, quantized.data());
    q = quantized.data();
  }
  offset_.resize(m.rows);
  for (int r = 0; r < m.rows; ++r) {
    const int8_t* qr = q + static_cast<size_t>(r) * m.cols;
    offset_[r] = 128 * std::accumulate(qr, qr + m.cols, 0);
  }
  packed_ = pack_weights(q, m.rows, m.cols, Dt::s8, Dt::u8, Dt::s32);
  block_ = dot_block(packed_.mem, 4, m.cols);
}

void linear_int8(const float* x, int n, std::span<const Int8Output> outs, ThreadPool* pool,
                 int gemv_tokens) {
  if (n <= gemv_tokens && gemv_fits(outs)) {
    gemv(x, n, outs, pool);
    return;
  }
  // One quantized copy of the input for every output (q, k and v; gate and up).
  const int cols = outs[0].w->cols();
  float* sx = scratch<float>(n);
  uint8_t* xq = scratch<uint8_t>(static_cast<size_t>(n) * cols);
  quantize_rows(x, n, cols, cols, xq, sx, pool);
  for (const Int8Output& o : outs) onednn_product(xq, sx, n, *o.w, o.y, pool, o.accumulate);
}

void linear_int8(const float* x, int n, const Int8Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate, int gemv_tokens) {
  const Int8Output out{&w, y, accumulate};
  linear_int8(x, n, {&out, 1}, pool, gemv_tokens);
}

}  // namespace fpa::cpu
