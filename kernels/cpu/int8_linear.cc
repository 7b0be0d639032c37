#include "kernels/cpu/int8_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "kernels/cpu/int8_amx.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/parallel.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

// A pass of the hand-written kernel holds T tokens x C columns of 16 outputs in registers: the
// whole block of 64 outputs (C = 4) for up to 6 tokens, half of it (C = 2) for up to 12, 24
// accumulators either way. More tokens go in balanced tiles of up to kMaxTile.
constexpr int kMaxTile = 12;
static_assert(kAmxTileTokens >= kMaxTile);  // one tile buffer serves either kernel
constexpr int columns(int tokens) { return tokens <= 6 ? 4 : 2; }

// As in bf16_linear.cc: compiled for its target whatever -march says, run only where
// cpu_has_vnni().
#define FPA_VNNI_TARGET [[gnu::target("avx512f,avx512bw,avx512vnni")]]

__mmask16 first(int lanes) { return static_cast<__mmask16>((1u << std::clamp(lanes, 0, 16)) - 1); }

// Activations are quantized per token: a scale sx = max |x| / 127 (token_scale) and
// q = round(x / sx) in [-127, 127], here columns [c, c + 16) of a row xr of `cols`.
FPA_VNNI_TARGET __m512i quantize_16(const float* xr, int cols, int c, __m512 inv) {
  const __mmask16 k = first(cols - c);
  return _mm512_maskz_cvtps_epi32(k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + c), inv));
}

// Writes a row's scale to sx; returns 1 / sx (0 for a zero row) in every lane.
FPA_VNNI_TARGET __m512 token_scale(const float* xr, int cols, float* sx) {
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
  *sx = m > 0 ? m / 127.0f : 1.0f;
  return _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f);
}

// For oneDNN's u8 x s8 matmul: rows of bytes q + 128.
FPA_VNNI_TARGET void quantize_tokens(const float* x, int n, int cols, uint8_t* out, float* sx) {
  for (int t = 0; t < n; ++t) {
    const float* xr = x + static_cast<long>(t) * cols;
    const __m512 inv = token_scale(xr, cols, sx + t);
    uint8_t* row = out + static_cast<long>(t) * cols;
    for (int c = 0; c < cols; c += 16) {
      const __m512i q = _mm512_add_epi32(quantize_16(xr, cols, c, inv), _mm512_set1_epi32(128));
      _mm512_mask_cvtusepi32_storeu_epi8(row + c, first(cols - c), q);
    }
  }
}

// The hand-written kernel's input: tokens [t0, t1) of x[n, cols] as quantize_tokens' bytes, in
// tiles of `tile` tokens (the last one the rest), 128 (zero) from cols to 4 * quads. A tile's
// quads go in lines of 16 per token, its tokens' lines of quads [16g, 16g + 16) one after another
// (quad 16g + i of its token u at (g * size + u) * 16 + i): a pass reads a token's quad at a fixed
// offset from one pointer, and two threads quantizing different tokens write different lines
// (interleaved per quad, they had shared every line: 10% slower at 4 tokens).
FPA_VNNI_TARGET void quantize_tile_tokens(const float* x, int t0, int t1, int n, int cols,
                                          int quads, int tile, uint32_t* words, float* sx) {
  for (int t = t0; t < t1; ++t) {
    const float* xr = x + static_cast<long>(t) * cols;
    const __m512 inv = token_scale(xr, cols, sx + t);
    const int size = std::min(tile, n - t / tile * tile);
    uint8_t* to = reinterpret_cast<uint8_t*>(words + static_cast<long>(t / tile) * tile * quads +
                                             16 * (t % tile));
    for (int c = 0; c < 4 * quads; c += 16) {
      const __m512i q = _mm512_add_epi32(quantize_16(xr, cols, c, inv), _mm512_set1_epi32(128));
      _mm512_mask_cvtusepi32_storeu_epi8(to + (c / 64 * size * 64) + c % 64, 0xffff, q);
    }
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
// bytes past it (0: one line). A block read in one pass streams its own lines 2 KiB ahead (the
// prefetcher alone lags). Read in several, every pass pulls its share of the NEXT block's lines
// (pass i of n: from line i * 4 * quads / n, ceil(4 / n) lines a quad, so the shares cover the
// block; for n = 3 and n > 4 they overlap, and a line asked for again is found in the cache), so
// DRAM streams while the passes compute; else it idles through the passes that re-read the block
// from the cache. The same two prefetches either way: no branch or division per quad.
struct Ahead {
  const int8_t* from;
  int step, second;
};

Ahead ahead_of(const int8_t* block, const int8_t* next, int quads, int pass, int passes) {
  if (next == nullptr) return {block + 2048, 256, 0};
  const int per = (4 + passes - 1) / passes;  // lines per quad, 2 at most for passes >= 2
  return {next + 64L * (4L * pass * quads / passes), 64 * per, per > 1 ? 64 : 0};
}

// acc += the products of x's unsigned and w's signed bytes, 4 per int32 lane. The intrinsic, in
// GCC 12, copied every accumulator into a new register and back on every quad (and spilled one
// to the stack: a store-to-load chain per quad); the instruction accumulates in place, and this
// kernel ran 1.3x faster from the cache for 4 and 8 tokens (bench/RESULTS.md).
FPA_VNNI_TARGET [[gnu::always_inline]] inline __m512i dpbusd(__m512i acc, __m512i x, __m512i w) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
  return acc;
}

// T tokens (their quads in lines, quantize_tile_tokens) against C columns of 16 outputs of
// one block in oneDNN's VNNI layout (per quad of inputs, 64 outputs x 4 inputs: four registers;
// wb at the pass's first): per quad, C weight registers and T broadcast quads, T x C vpdpbusd
// steps. acc[t] gets the C * 16 sums from its column on.
template <int T, int C>
FPA_VNNI_TARGET void dot_block_tokens(const int8_t* wb, int quads, const uint32_t* x, Ahead ahead,
                                      int32_t (*acc)[64]) {
  __m512i a[T][C];
  for (auto& row : a) {
    for (__m512i& v : row) v = _mm512_setzero_si512();
  }
  for (int g = 0; g < quads; g += 16) {  // the tokens' lines of 16 quads (quads: a multiple)
    const uint32_t* xg = x + g * T;
    for (int q = g; q < g + 16; ++q) {
      const int8_t* line = ahead.from + static_cast<long>(q) * ahead.step;
      __builtin_prefetch(line);
      __builtin_prefetch(line + ahead.second);
      __m512i w[C];
      for (int j = 0; j < C; ++j) w[j] = _mm512_loadu_si512(wb + q * 256 + 64 * j);
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_set1_epi32(static_cast<int>(xg[q - g + 16 * t]));
        for (int j = 0; j < C; ++j) a[t][j] = dpbusd(a[t][j], xv, w[j]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < C; ++j) _mm512_storeu_si512(acc[t] + 16 * j, a[t][j]);
  }
}

using DotFn = void (*)(const int8_t*, int, const uint32_t*, Ahead, int32_t (*)[64]);

// The kernels of 1 to N tokens over C columns: a tile's passes all take the tile size's C (the
// last tile, shorter, too).
template <int C, int... T>
constexpr std::array<DotFn, sizeof...(T)> dot_table(std::integer_sequence<int, T...>) {
  return {&dot_block_tokens<T + 1, C>...};
}
constexpr auto kDotWhole = dot_table<4>(std::make_integer_sequence<int, 6>());
constexpr auto kDotHalf = dot_table<2>(std::make_integer_sequence<int, kMaxTile>());
static_assert(columns(kDotWhole.size()) == 4 && columns(kDotWhole.size() + 1) == 2);

// The hand-written kernel's quantized input: n tokens in tiles of `tile` (the last may be
// shorter), each tile's quads in lines per token (quantize_tile_tokens).
struct TileInput {
  const uint32_t* words;
  const float* sx;
  int n, tile, quads;
  bool amx;  // tiles of up to kAmxTileTokens through amx_dot_block, else up to kMaxTile

  int tiles() const { return (n + tile - 1) / tile; }
  // Passes over a block per tile of tokens: one through AMX, else one per share of its columns
  // that a pass holds in registers (1 or 2).
  int halves() const { return amx ? 1 : 4 / columns(tile); }
};

// The blocks of several products of one input, numbered one after another (a layer's q, k and
// v), and what the kernel reads them with.
struct JointBlocks {
  std::span<const Int8Output> outs;
  TileInput x;

  // The output holding joint block b, and b's number in it (none for b < 0).
  std::pair<const Int8Output*, int> locate(int b) const {
    if (b < 0) return {nullptr, 0};
    for (const Int8Output& o : outs) {
      const int blocks = (o.w->rows() + 63) / 64;
      if (b < blocks) return {&o, b};
      b -= blocks;
    }
    return {nullptr, 0};
  }
  const int8_t* bits(const Int8Output& o, int b) const {
    return static_cast<const int8_t*>(o.w->packed().get_data_handle()) + b * o.w->block();
  }
  // Joint block b's bits (nullptr for none).
  const int8_t* bits(int b) const {
    const auto [o, ob] = locate(b);
    return o != nullptr ? bits(*o, ob) : nullptr;
  }
};

// One tile of tokens against one block, on the VNNI kernel: acc[t][0, 64) the int32 sums.
void vnni_tile(const TileInput& x, const int8_t* block, const int8_t* next, int k, int size,
               int32_t (*acc)[64]) {
  const int halves = x.halves();
  const DotFn* dot = halves == 1 ? kDotWhole.data() : kDotHalf.data();
  const uint32_t* words = x.words + static_cast<long>(k) * x.tile * x.quads;
  for (int h = 0; h < halves; ++h) {
    const int col = h * 64 / halves;  // the pass's first output in the block
    dot[size - 1](block + 4 * col, x.quads, words,
                  ahead_of(block, next, x.quads, k * halves + h, halves * x.tiles()),
                  reinterpret_cast<int32_t(*)[64]>(&acc[0][col]));
  }
}

// Tokens against joint blocks [b0, b1): each block streamed once from memory, every further pass
// over it (a second half of its columns, a second tile of tokens) reading it from the L2 while
// the next block (b + 1, or `then`, the first of the thread's next range) comes in.
void gemv_blocks(const JointBlocks& j, int b0, int b1, int then) {
  const TileInput& x = j.x;
  const int tiles = x.tiles(), passes = x.halves() * tiles;
  for (int b = b0; b < b1; ++b) {
    const auto [o, ob] = j.locate(b);
    const Int8Matrix& w = *o->w;
    const int n0 = ob * 64, count = std::min(64, w.rows() - n0);
    const int8_t* block = j.bits(*o, ob);
    const int8_t* next = passes > 1 ? j.bits(b + 1 < b1 ? b + 1 : then) : nullptr;
    for (int k = 0; k < tiles; ++k) {
      const int t0 = k * x.tile, size = std::min(x.tile, x.n - t0);
      int32_t acc[kAmxTileTokens][64];
      if (x.amx) {
        const auto* lines = reinterpret_cast<const uint8_t*>(x.words + long{t0} * x.quads);
        amx_dot_block(block, x.quads, lines, size, amx_ahead(block, next, x.quads, k, passes), acc);
      } else {
        vnni_tile(x, block, next, k, size, acc);
      }
      for (int t = 0; t < size; ++t) {
        dequantize(acc[t], count, w.offset() + n0, w.scale() + n0, x.sx[t0 + t],
                   o->y + static_cast<long>(t0 + t) * w.rows() + n0, o->accumulate);
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

// x[n, cols] quantized as quantize_tokens does, blocks of tokens on the pool: serial, each of a
// prompt chunk's quantizations kept the pool's other thread waiting.
void quantize_rows(const float* x, int n, int cols, uint8_t* out, float* sx, ThreadPool* pool) {
  for_token_rows(pool, n, static_cast<long>(n) * cols, [&](int r0, int rows) {
    quantize_tokens(x + static_cast<long>(r0) * cols, rows, cols,
                    out + static_cast<long>(r0) * cols, sx + r0);
  });
}

// 1 to gemv_tokens tokens: the hand-written kernel over the packed blocks, every output's blocks
// numbered one after another and shared out in one pass over the pool; with AMX tiles where `amx`.
void gemv(const float* x, int n, std::span<const Int8Output> outs, ThreadPool* pool, bool amx) {
  const Int8Matrix& w0 = *outs[0].w;
  const int most = amx ? kAmxTileTokens : kMaxTile;
  const int quads = static_cast<int>(w0.block() / 256), tiles = (n + most - 1) / most;
  const int tile = (n + tiles - 1) / tiles;
  // Its lines 64-byte aligned, so that no two threads' tokens share one.
  uint32_t* words = scratch<uint32_t>(static_cast<size_t>(n) * quads + 16);
  words += (-reinterpret_cast<uintptr_t>(words) / sizeof *words) % 16;
  float* sx = scratch<float>(n);
  for_token_rows(pool, n, static_cast<long>(n) * w0.cols(), [&](int r0, int rows) {
    quantize_tile_tokens(x, r0, r0 + rows, n, w0.cols(), quads, tile, words, sx);
  });
  const JointBlocks joint{
      outs, {.words = words, .sx = sx, .n = n, .tile = tile, .quads = quads, .amx = amx}};
  long rows = 0;
  for (const Int8Output& o : outs) rows += (o.w->rows() + 63) / 64 * 64;
  // Guided ranges, shrinking to a block or two at the end, so that the threads finish together
  // (at 1 token a few per cent, bench/RESULTS.md); each thread's passes over 7 or more tokens
  // fetch its next range's first block (then) while they read the last of this one.
  for_output_blocks(
      pool, static_cast<int>(rows), n * rows * w0.cols(),
      [&](int b0, int b1, int then) { gemv_blocks(joint, b0, b1, then); }, true);
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
  if (block_ % (64 * 64) != 0) block_ = 0;  // the kernel reads lines of 16 quads of inputs
}

void linear_int8(const float* x, int n, std::span<const Int8Output> outs, ThreadPool* pool,
                 Int8Route route) {
  if (n <= route.gemv_tokens && gemv_fits(outs)) {
    gemv(x, n, outs, pool, n >= route.amx_tokens && cpu_has_amx_int8());
    return;
  }
  // One quantized copy of the input for every output (q, k and v; gate and up).
  const int cols = outs[0].w->cols();
  float* sx = scratch<float>(n);
  uint8_t* xq = scratch<uint8_t>(static_cast<size_t>(n) * cols);
  quantize_rows(x, n, cols, xq, sx, pool);
  for (const Int8Output& o : outs) onednn_product(xq, sx, n, *o.w, o.y, pool, o.accumulate);
}

void linear_int8(const float* x, int n, const Int8Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate, Int8Route route) {
  const Int8Output out{&w, y, accumulate};
  linear_int8(x, n, {&out, 1}, pool, route);
}

}  // namespace fpa::cpu
