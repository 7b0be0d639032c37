#include "kernels/cpu/bf16_linear.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

constexpr int kLanes = 32;  // bf16 values in one 512-bit register

// Rounded up to whole 512-bit registers of bf16.
int padded(int cols) { return (cols + kLanes - 1) / kLanes * kLanes; }

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The weights as matmul's operand [cols, rows]: w^T, which w's row-major bits are as "ba".
memory::desc weights_desc(int rows, int cols, bool any) {
  return memory::desc({cols, rows}, Dt::bf16,
                      any ? memory::format_tag::any : memory::format_tag::ba);
}

memory::desc src_desc(int n, int cols) {
  return memory::desc({n, cols}, Dt::bf16, memory::format_tag::ab);
}

memory::desc dst_desc(int n, int rows) {
  return memory::desc({n, rows}, Dt::f32, memory::format_tag::ab);
}

// One primitive per shape, token count and accumulation, shared by every matrix of that shape
// (a primitive binds no weights). The token counts a server sees repeat (batch sizes, chunk
// lengths); the map is cleared when it grows past what they need.
dnnl::matmul primitive(const Bf16Matrix& w, int n, bool accumulate) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, bool>, dnnl::matmul> cache;
  std::lock_guard lock(mu);
  const auto key = std::make_tuple(w.rows(), w.cols(), n, accumulate);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 512) cache.clear();
  dnnl::post_ops ops;
  if (accumulate) ops.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const dnnl::matmul::desc d(src_desc(n, w.cols()), w.packed().get_desc(), dst_desc(n, w.rows()));
  return cache.emplace(key, dnnl::matmul({d, attr, engine()})).first->second;
}

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
  // The layout oneDNN picks for a product of 64 tokens (the blocked one of its brgemm kernels).
  // Every primitive reads this one packed copy, whatever its token count, and one token goes
  // through gemv_blocks where the layout is the one that kernel reads.
  constexpr int kPackTokens = 64;
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(src_desc(kPackTokens, m.cols), weights_desc(m.rows, m.cols, true),
                         dst_desc(kPackTokens, m.rows)),
      engine());
  const memory::desc packed = pd.weights_desc();
  packed_ = memory(packed, engine());
  const dnnl_memory_desc_t& d = packed.data;
  const auto& blk = d.format_desc.blocking;
  const long k = d.padded_dims[0];
  if (d.format_kind == dnnl_blocked && blk.inner_nblks == 3 && blk.inner_blks[0] == 16 &&
      blk.inner_idxs[0] == 0 && blk.inner_blks[1] == 64 && blk.inner_idxs[1] == 1 &&
      blk.inner_blks[2] == 2 && blk.inner_idxs[2] == 0 && blk.strides[0] == 32 * 64 &&
      blk.strides[1] == k * 64 && k <= padded(m.cols)) {
    block_ = k * 64;
  }
  memory plain(weights_desc(m.rows, m.cols, false), engine(), const_cast<uint16_t*>(bits));
  dnnl::stream s(engine());
  dnnl::reorder(plain, packed_).execute(s, plain, packed_);
  s.wait();
}

void linear_bf16(const float* x, int n, const Bf16Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate) {
  uint16_t* xb = scratch(padded(n * w.cols()));
  convert_rows(x, n, w.cols(), xb);
  if (n == 1 && w.block() > 0) {
    const int blocks = (w.rows() + 63) / 64;
    const int threads = pool != nullptr ? pool->threads() : 1;
    const int parts = std::min(blocks, threads * 4);  // a fast thread can take a slow one's share
    parallel_for(pool, parts, static_cast<long>(w.rows()) * w.cols(), [&](int i) {
      gemv_blocks(w, xb, y, blocks * i / parts, blocks * (i + 1) / parts, accumulate);
    });
    return;
  }
  const dnnl::matmul mm = primitive(w, n, accumulate);
  thread_local dnnl::stream stream(engine());
  memory src(src_desc(n, w.cols()), engine(), xb);
  memory dst(dst_desc(n, w.rows()), engine(), y);
  omp_set_num_threads(pool != nullptr ? pool->threads() : 1);
  mm.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w.packed()}, {DNNL_ARG_DST, dst}});
  stream.wait();
}

}  // namespace fpa::cpu
