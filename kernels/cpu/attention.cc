#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace fpa::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The kernels are templates on the head dimension D: with D known (the usual 16 ... 128) the
// inner loops unroll and the output row stays in registers across keys; D = 0 takes any size.
// Forced inline: one call per key of 64-odd floats, the call would cost as much as the work.
[[gnu::always_inline]] inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

[[gnu::always_inline]] inline void axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// beta * max(0, lvl - m), or +inf for an excluded key; m = +inf (empty segment) and beta = 0
// give no penalty.
float penalty(Penalty p, float lvl, float m) {
  if (!(p.beta > 0.0f)) return 0.0f;
  const float excess = lvl - m;
  return excess >= p.threshold ? kInf : p.beta * std::max(0.0f, excess);
}

// Scores -> probabilities in place; -inf entries (free slots) become 0.
void softmax(float* s, size_t n) {
  float mx = -kInf;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, s[i]);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (size_t i = 0; i < n; ++i) s[i] *= inv;
}

// Per-thread score buffer.
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// A query's weighted sum of values: in a local array the compiler keeps in registers when D is
// known, else directly in the output row.
template <int D>
class OutRow {
 public:
  OutRow(float* out, int dim) : out_(out), dim_(D > 0 ? D : dim) {
    std::fill(row(), row() + dim_, 0.0f);
  }
  [[gnu::always_inline]] void add(float p, const float* v) { axpy(p, v, row(), dim_); }
  void store(float scale) {
    const float* r = row();
    for (int i = 0; i < dim_; ++i) out_[i] = r[i] * scale;
  }

 private:
  float* row() { return D > 0 ? local_ : out_; }
  float* out_;
  const int dim_;
  float local_[D > 0 ? D : 1];
};

template <int D>
void decode_impl(const float* q, float phi, int32_t pos, Penalty pen, int head_dim,
                 const CachedKeys& keys, float* out) {
  const int dim = D > 0 ? D : head_dim;
  const int ps = keys.page_slots;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  float* s = scratch(keys.pages.size() * ps);
  float mx = -kInf;
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      float& sj = s[p * ps + j];
      if (pv.pos[j] < 0) continue;
      if (pv.pos[j] < pos) pv.m[j] = std::min(pv.m[j], phi);
      sj =
          dot(q, pv.k + static_cast<long>(j) * dim, dim) * scale - penalty(pen, pv.lvl[j], pv.m[j]);
      mx = std::max(mx, sj);
    }
  }
  // One pass over the values with the final maximum; probabilities stay in s for acc.
  OutRow<D> row(out, dim);
  double z = 0.0;
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] < 0) continue;
      const float e = std::exp(s[p * ps + j] - mx);
      s[p * ps + j] = e;
      z += e;
      row.add(e, pv.v + static_cast<long>(j) * dim);
    }
  }
  const float inv = static_cast<float>(1.0 / z);
  row.store(inv);
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] >= 0) pv.acc[j] += s[p * ps + j] * inv;
    }
  }
}

template <int D>
void prefill_impl(const Chunk& c, Penalty pen, int head_dim, const CachedKeys& keys, float* out,
                  float* chunk_acc) {
  const int dim = D > 0 ? D : head_dim;
  const int ps = keys.page_slots;
  const size_t n_old = keys.pages.size() * ps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  float* s = scratch(n_old + c.n);
  std::fill(chunk_acc, chunk_acc + c.n, 0.0f);
  float prefix_min = kInf;  // min of the chunk's phi up to the query
  for (int t = 0; t < c.n; ++t) {
    prefix_min = std::min(prefix_min, c.phi[t]);
    const float* qt = c.q + t * c.stride;
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      const cache::PageView& pv = keys.pages[p];
      for (int j = 0; j < ps; ++j) {
        s[p * ps + j] = pv.pos[j] < 0 ? -kInf
                                      : dot(qt, pv.k + static_cast<long>(j) * dim, dim) * scale -
                                            penalty(pen, pv.lvl[j], std::min(pv.m[j], prefix_min));
      }
    }
    float seg_min = kInf;  // min of phi over (j, t], walking j down from t
    for (int j = t; j >= 0; --j) {
      s[n_old + j] = dot(qt, c.k + j * c.stride, dim) * scale - penalty(pen, c.lvl[j], seg_min);
      seg_min = std::min(seg_min, c.phi[j]);
    }
    softmax(s, n_old + t + 1);
    OutRow<D> row(out + t * c.stride, dim);
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      const cache::PageView& pv = keys.pages[p];
      for (int j = 0; j < ps; ++j) {
        if (pv.pos[j] < 0) continue;
        row.add(s[p * ps + j], pv.v + static_cast<long>(j) * dim);
        pv.acc[j] += s[p * ps + j];
      }
    }
    for (int j = 0; j <= t; ++j) {
      row.add(s[n_old + j], c.v + j * c.stride);
      chunk_acc[j] += s[n_old + j];
    }
    row.store(1.0f);
  }
  for (const cache::PageView& pv : keys.pages) {
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] >= 0) pv.m[j] = std::min(pv.m[j], prefix_min);
    }
  }
}

}  // namespace

void decode_attention(const float* q, float phi, int32_t pos, Penalty pen, int head_dim,
                      const CachedKeys& keys, float* out) {
  switch (head_dim) {
    case 16:
      return decode_impl<16>(q, phi, pos, pen, head_dim, keys, out);
    case 32:
      return decode_impl<32>(q, phi, pos, pen, head_dim, keys, out);
    case 64:
      return decode_impl<64>(q, phi, pos, pen, head_dim, keys, out);
    case 128:
      return decode_impl<128>(q, phi, pos, pen, head_dim, keys, out);
    default:
      return decode_impl<0>(q, phi, pos, pen, head_dim, keys, out);
  }
}

void prefill_attention(const Chunk& chunk, Penalty pen, int head_dim, const CachedKeys& keys,
                       float* out, float* chunk_acc) {
  switch (head_dim) {
    case 16:
      return prefill_impl<16>(chunk, pen, head_dim, keys, out, chunk_acc);
    case 32:
      return prefill_impl<32>(chunk, pen, head_dim, keys, out, chunk_acc);
    case 64:
      return prefill_impl<64>(chunk, pen, head_dim, keys, out, chunk_acc);
    case 128:
      return prefill_impl<128>(chunk, pen, head_dim, keys, out, chunk_acc);
    default:
      return prefill_impl<0>(chunk, pen, head_dim, keys, out, chunk_acc);
  }
}

}  // namespace fpa::cpu
