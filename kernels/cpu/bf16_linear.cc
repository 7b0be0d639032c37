#include "kernels/cpu/bf16_linear.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

constexpr int kLanes = 32;  // bf16 values in one 512-bit register

// Activations are rounded into rows of a multiple of 32 values: whole 512-bit stores.
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
  return memory::desc({n, cols}, Dt::bf16, memory::dims{padded(cols), 1});
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

// x[n, cols] -> bf16 rows of padded(cols) (zero-padded), 32 values per conversion.
FPA_BF16_TARGET void convert_rows(const float* x, int n, int cols, uint16_t* out) {
  const int stride = padded(cols);
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

// Per-thread bf16 activations.
uint16_t* scratch(size_t n) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

bool cpu_has_bf16() { return __builtin_cpu_supports("avx512bf16"); }

Bf16Matrix::Bf16Matrix(const Matrix& m) : rows_(m.rows), cols_(m.cols) {
  std::vector<uint16_t> bits(static_cast<size_t>(m.rows) * m.cols);
  to_bf16(m.data, bits.size(), bits.data());
  // The layout oneDNN picks for one token; it is the same for every token count (checked on
  // this project's shapes), so every primitive reads the one packed copy.
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(src_desc(1, m.cols), weights_desc(m.rows, m.cols, true),
                         dst_desc(1, m.rows)),
      engine());
  packed_ = memory(pd.weights_desc(), engine());
  memory plain(weights_desc(m.rows, m.cols, false), engine(), bits.data());
  dnnl::stream s(engine());
  dnnl::reorder(plain, packed_).execute(s, plain, packed_);
  s.wait();
}

void linear_bf16(const float* x, int n, const Bf16Matrix& w, float* y, ThreadPool* pool,
                 bool accumulate) {
  uint16_t* xb = scratch(static_cast<size_t>(n) * padded(w.cols()));
  convert_rows(x, n, w.cols(), xb);
  const dnnl::matmul mm = primitive(w, n, accumulate);
  thread_local dnnl::stream stream(engine());
  memory src(src_desc(n, w.cols()), engine(), xb);
  memory dst(dst_desc(n, w.rows()), engine(), y);
  omp_set_num_threads(pool != nullptr ? pool->threads() : 1);
  mm.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w.packed()}, {DNNL_ARG_DST, dst}});
  stream.wait();
}

}  // namespace fpa::cpu
