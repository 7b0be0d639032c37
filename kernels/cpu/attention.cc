#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace fpa::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

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

}  // namespace

void decode_attention(const float* q, float phi, int32_t pos, Penalty pen, int head_dim,
                      const CachedKeys& keys, float* out) {
  const int ps = keys.page_slots;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  float* s = scratch(keys.pages.size() * ps);
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      float& sj = s[p * ps + j];
      if (pv.pos[j] < 0) {
        sj = -kInf;
        continue;
      }
      if (pv.pos[j] < pos) pv.m[j] = std::min(pv.m[j], phi);
      sj = dot(q, pv.k + static_cast<long>(j) * head_dim, head_dim) * scale -
           penalty(pen, pv.lvl[j], pv.m[j]);
    }
  }
  softmax(s, keys.pages.size() * ps);
  std::fill(out, out + head_dim, 0.0f);
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      const float pj = s[p * ps + j];
      if (pv.pos[j] < 0) continue;
      axpy(pj, pv.v + static_cast<long>(j) * head_dim, out, head_dim);
      pv.acc[j] += pj;
    }
  }
}

void prefill_attention(const Chunk& c, Penalty pen, int head_dim, const CachedKeys& keys,
                       float* out, float* chunk_acc) {
  const int ps = keys.page_slots;
  const size_t n_old = keys.pages.size() * ps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  float* s = scratch(n_old + c.n);
  std::fill(chunk_acc, chunk_acc + c.n, 0.0f);
  float prefix_min = kInf;  // min of the chunk's phi up to the query
  for (int t = 0; t < c.n; ++t) {
    prefix_min = std::min(prefix_min, c.phi[t]);
    const float* qt = c.q + t * c.stride;
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      const cache::PageView& pv = keys.pages[p];
      for (int j = 0; j < ps; ++j) {
        s[p * ps + j] = pv.pos[j] < 0
                            ? -kInf
                            : dot(qt, pv.k + static_cast<long>(j) * head_dim, head_dim) * scale -
                                  penalty(pen, pv.lvl[j], std::min(pv.m[j], prefix_min));
      }
    }
    float seg_min = kInf;  // min of phi over (j, t], walking j down from t
    for (int j = t; j >= 0; --j) {
      s[n_old + j] =
          dot(qt, c.k + j * c.stride, head_dim) * scale - penalty(pen, c.lvl[j], seg_min);
      seg_min = std::min(seg_min, c.phi[j]);
    }
    softmax(s, n_old + t + 1);
    float* ot = out + t * c.stride;
    std::fill(ot, ot + head_dim, 0.0f);
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      const cache::PageView& pv = keys.pages[p];
      for (int j = 0; j < ps; ++j) {
        if (pv.pos[j] < 0) continue;
        axpy(s[p * ps + j], pv.v + static_cast<long>(j) * head_dim, ot, head_dim);
        pv.acc[j] += s[p * ps + j];
      }
    }
    for (int j = 0; j <= t; ++j) {
      axpy(s[n_old + j], c.v + j * c.stride, ot, head_dim);
      chunk_acc[j] += s[n_old + j];
    }
  }
  for (const cache::PageView& pv : keys.pages) {
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] >= 0) pv.m[j] = std::min(pv.m[j], prefix_min);
    }
  }
}

}  // namespace fpa::cpu
