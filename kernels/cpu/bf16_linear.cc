#include "kernels/cpu/bf16_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/onednn.h"
#include "kernels/cpu/parallel.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

constexpr int kLanes = 32;  // bf16 values in one 512-bit register

// Rounded up to whole 512-bit registers of bf16.
int padded(int cols) { return (cols + kLanes - 1) / kLanes * kLanes; }

// The AVX-512 code is compiled for its target whatever -march says, and runs only where
// cpu_has_bf16(). Registers are reinterpreted with GCC vector casts: std::bit_cast would be a
// function passing 512-bit vectors outside that target (another ABI).
#define FPA_BF16_TARGET [[gnu::target("avx512f,avx512bw,avx512bf16")]]

// x[n, cols] -> bf16 rows of `cols` (dense: oneDNN's brgemm refuses padded rows), 32 values per
// conversion, then zeros up to the next multiple of 32 (the one-token kernel reads them).
FPA_BF16_TARGET void convert_rows(const float* x, int n, int cols, uint16_t* out) {
  const long total = static_cast<long>(n) * cols;
  for (long c = 0; c < padded(static_cast<int>(total)); c += kLanes) {
    const long lo = std::clamp(total - c, 0L, 16L), hi = std::clamp(total - c - 16, 0L, 16L);
    const __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lo) - 1), x + c);
    const __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << hi) - 1), x + c + 16);
    _mm512_storeu_si512(out + c, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

// One token against blocks [b0, b1) of 64 outputs in the pair-interleaved layout: per pair of
// inputs, 64 outputs x 2 inputs are four registers, each a dot product step of 16 outputs with
// the pair broadcast. Streams each block once, front to back: a batch-1 step is bound by these
// bytes, and on cold weights oneDNN's own kernel read them at 14-21 GB/s where this one reads
// 22-24.
FPA_BF16_TARGET void gemv_blocks(const Bf16Matrix& w, const uint16_t* x, float* y, int b0, int b1,
                                 bool accumulate) {
  const uint16_t* bits = static_cast<const uint16_t*>(w.packed().get_data_handle());
  const int pairs = static_cast<int>(w.block() / 128);
  for (int b = b0; b < b1; ++b) {
    const uint16_t* wb = bits + b * w.block();
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int p = 0; p < pairs; ++p) {
      const uint16_t* wp = wb + p * 128;
      __builtin_prefetch(wp + 1024);  // 2 KiB ahead: the prefetcher alone left bandwidth unused
      uint32_t pair;
      std::memcpy(&pair, x + 2 * p, sizeof pair);
      const __m512bh xv = (__m512bh)(_mm512_set1_epi32(static_cast<int>(pair)));
      for (int j = 0; j < 4; ++j) {
        acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)(_mm512_loadu_si512(wp + 32 * j)), xv);
      }
    }
    for (int j = 0; j < 4; ++j) {
      const int n0 = b * 64 + 16 * j;
      const int lanes = std::clamp(w.rows() - n0, 0, 16);
      if (lanes == 0) break;
      const __mmask16 m = static_cast<__mmask16>((1u << lanes) - 1);
      __m512 v = acc[j];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, y + n0));
      _mm512_mask_storeu_ps(y + n0, m, v);
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

Bf16Matrix::Bf16Matrix(const Matrix& m) : rows_(m.rows), cols_(m.cols) {
  std::vector<uint16_t> rounded;
  const uint16_t* bits = m.bf16;  // as the file stores them, else rounded from float32
  if (bits == nullptr) {
    rounded.resize(static_cast<size_t>(m.rows) * m.cols);
    to_bf16(m.data, rounded.size(), rounded.data());
    bits = rounded.data();
  }
  packed_ = pack_weights(bits, m.rows, m.cols, Dt::bf16, Dt::bf16, Dt::f32);
  // One token goes through gemv_blocks where the layout is the one it reads, and reads no
  // further than convert_rows zeroes.
  block_ = dot_block(packed_.mem, 2, m.cols);
  if (block_ / 64 > padded(m.cols)) block_ = 0;
}

void linear_bf16(const float* x, int n, const Bf16Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate) {
  uint16_t* xb = scratch(padded(n * w.cols()));
  convert_rows(x, n, w.cols(), xb);
  if (n == 1 && w.block() > 0) {
    for_output_blocks(pool, w.rows(), static_cast<long>(w.rows()) * w.cols(),
                      [&](int b0, int b1) { gemv_blocks(w, xb, y, b0, b1, accumulate); });
    return;
  }
  const dnnl::matmul mm = matmul(w.packed(), w.rows(), w.cols(), n, Dt::bf16, Dt::f32, accumulate);
  const dnnl::engine& e = onednn_engine();
  run_matmul(mm, memory(rows_desc(n, w.cols(), Dt::bf16), e, xb), w.packed(),
             memory(rows_desc(n, w.rows(), Dt::f32), e, y), pool);
}

}  // namespace fpa::cpu
