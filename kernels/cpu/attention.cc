#include "kernels/cpu/attention.h"

#include <cblas.h>

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

// exp(x) for x = score - max <= 0. Below -80 the term is < 1e-34 of the largest one (which adds
// 1 to the sum) and cannot change a float sum; returning 0 skips libm's slow underflow path,
// which strong penalties hit often.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  return x < -80.0f ? 0.0f : std::exp(x);
}

// Scores -> probabilities in place; -inf entries (free slots) become 0.
void softmax(float* s, size_t n) {
  float mx = -kInf;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, s[i]);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    s[i] = exp_nonpositive(s[i] - mx);
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
      const float e = exp_nonpositive(s[p * ps + j] - mx);
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

// Free slots may hold anything (even NaN bits); their probability is 0, but 0 * NaN is NaN in a
// matrix product, so their values are cleared first. The slots belong to this stream alone.
void clear_free_values(const CachedKeys& keys, int dim) {
  for (const cache::PageView& pv : keys.pages) {
    for (int j = 0; j < keys.page_slots; ++j) {
      if (pv.pos[j] < 0) std::fill_n(pv.v + static_cast<long>(j) * dim, dim, 0.0f);
    }
  }
}

// Scores of one query row against the cached keys and the chunk keys 0..t, penalised and masked
// in place (raw dot products * scale on entry); prefix_min is min(phi) over the chunk up to t.
void penalise_row(float* row, const Chunk& c, int t, float prefix_min, Penalty pen,
                  const CachedKeys& keys, int visible) {
  const int ps = keys.page_slots;
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      float& x = row[p * ps + j];
      x = pv.pos[j] < 0 ? -kInf : x - penalty(pen, pv.lvl[j], std::min(pv.m[j], prefix_min));
    }
  }
  float* chunk = row + keys.pages.size() * ps;
  float seg_min = kInf;  // min of phi over (j, t], walking j down from t
  for (int j = t; j >= 0; --j) {
    chunk[j] -= penalty(pen, c.lvl[j], seg_min);
    seg_min = std::min(seg_min, c.phi[j]);
  }
  std::fill(chunk + t + 1, chunk + visible, -kInf);  // causal
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

// Blocks of query rows: scores and the weighted values are matrix products (per page of cached
// keys, and over the chunk's own keys), the penalty and the softmax are row by row.
void prefill_attention(const Chunk& c, Penalty pen, int dim, const CachedKeys& keys, float* out,
                       float* chunk_acc) {
  constexpr int kRows = 32;
  const int ps = keys.page_slots;
  const size_t n_old = keys.pages.size() * ps;
  const size_t ld = n_old + c.n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  float* s = scratch(kRows * ld);
  clear_free_values(keys, dim);
  std::fill(chunk_acc, chunk_acc + c.n, 0.0f);
  float prefix_min = kInf;
  for (int t0 = 0; t0 < c.n; t0 += kRows) {
    const int rows = std::min(kRows, c.n - t0), visible = t0 + rows;
    const float* q = c.q + t0 * c.stride;
    float* o = out + t0 * c.stride;
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, ps, dim, scale, q, c.stride,
                  keys.pages[p].k, dim, 0.0f, s + p * ps, ld);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, visible, dim, scale, q, c.stride,
                c.k, c.stride, 0.0f, s + n_old, ld);
    for (int r = 0; r < rows; ++r) {
      prefix_min = std::min(prefix_min, c.phi[t0 + r]);
      penalise_row(s + r * ld, c, t0 + r, prefix_min, pen, keys, visible);
      softmax(s + r * ld, n_old + visible);
    }
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dim, ps, 1.0f, s + p * ps, ld,
                  keys.pages[p].v, dim, p == 0 ? 0.0f : 1.0f, o, c.stride);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dim, visible, 1.0f, s + n_old, ld,
                c.v, c.stride, keys.pages.empty() ? 0.0f : 1.0f, o, c.stride);
    for (int r = 0; r < rows; ++r) {  // attention mass, for h2o
      const float* row = s + r * ld;
      for (size_t p = 0; p < keys.pages.size(); ++p) {
        for (int j = 0; j < ps; ++j) keys.pages[p].acc[j] += row[p * ps + j];
      }
      for (int j = 0; j < visible; ++j) chunk_acc[j] += row[n_old + j];
    }
  }
  for (const cache::PageView& pv : keys.pages) {
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] >= 0) pv.m[j] = std::min(pv.m[j], prefix_min);
    }
  }
}

}  // namespace fpa::cpu
