#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/lanes.h"
#include "model/bf16.h"

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

// penalty() of 16 keys.
[[gnu::always_inline]] inline Lanes penalty(Penalty p, Lanes lvl, Lanes m) {
  const Lanes zero = Lanes{};
  if (!(p.beta > 0.0f)) return zero;
  const Lanes excess = lvl - m;
  return excess >= p.threshold ? zero + kInf : p.beta * (excess > zero ? excess : zero);
}

// 16 entries of a page's per-slot array from slot j0, w (<= 16) of them real and the rest `fill`.
template <typename V, typename T>
[[gnu::always_inline]] inline V load_slots(const T* p, int w, T fill) {
  alignas(64) T tmp[16];
  if (w < 16) std::fill_n(std::copy_n(p, w, tmp), 16 - w, fill), p = tmp;
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
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
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const Lanes e = exp_lanes(load(s + i) - mx);
    store(s + i, e);
    sum += hsum(e);
  }
  for (; i < n; ++i) {
    s[i] = exp_nonpositive(s[i] - mx);
    sum += s[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (i = 0; i < n; ++i) s[i] *= inv;
}

// Per-thread score buffer.
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// A head's row of D floats in registers: D / 32 pairs of vectors, then 16 more where D % 32 is 16.
// A pair holds 32 consecutive elements in the order a cached row of type K loads fastest: a
// bf16 row's even elements, then its odd ones (a bf16 is the upper half of a float, so one
// 64-byte load widens to both by a shift and a mask: no shuffle), a float32 row's first 16, then
// the next 16. The query and the output row are held in the same order, so products and sums
// pair the same elements; only the query's load and the output's store reorder.
template <int D, typename K>
struct RowOrder {
  static_assert(D % 16 == 0);
  static constexpr int kPairs = D / 32, kN = D / 16;
  typedef uint32_t Words __attribute__((vector_size(64)));

  // A cached row, as the kernel reads it for every key.
  [[gnu::always_inline]] static void load_row(const K* p, Lanes (&out)[kN]) {
    for (int c = 0; c < kPairs; ++c) {
      if constexpr (std::is_same_v<K, float>) {
        out[2 * c] = load(p + 32 * c), out[2 * c + 1] = load(p + 32 * c + 16);
      } else {
        Words w;
        std::memcpy(&w, p + 32 * c, sizeof w);
        const Words even = w << 16, odd = w & 0xffff0000u;
        std::memcpy(&out[2 * c], &even, sizeof even);
        std::memcpy(&out[2 * c + 1], &odd, sizeof odd);
      }
    }
    if constexpr (kN % 2 == 1) out[kN - 1] = load(p + 32 * kPairs);
  }
  // A float32 row (the query, the step's own key and value) into the same order.
  [[gnu::always_inline]] static void split(const float* x, Lanes (&out)[kN]) {
    for (int i = 0; i < kN; ++i) out[i] = load(x + 16 * i);
    if constexpr (!std::is_same_v<K, float>) {
      for (int c = 0; c < kPairs; ++c) {
        const Lanes lo = out[2 * c], hi = out[2 * c + 1];
        out[2 * c] = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                             26, 28, 30);
        out[2 * c + 1] = __builtin_shufflevector(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23,
                                                 25, 27, 29, 31);
      }
    }
  }
  // The inverse of split.
  [[gnu::always_inline]] static void merge(const Lanes (&in)[kN], float* x) {
    Lanes out[kN];
    for (int i = 0; i < kN; ++i) out[i] = in[i];
    if constexpr (!std::is_same_v<K, float>) {
      for (int c = 0; c < kPairs; ++c) {
        const Lanes even = in[2 * c], odd = in[2 * c + 1];
        out[2 * c] = __builtin_shufflevector(even, odd, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6,
                                             22, 7, 23);
        out[2 * c + 1] = __builtin_shufflevector(even, odd, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28,
                                                 13, 29, 14, 30, 15, 31);
      }
    }
    for (int i = 0; i < kN; ++i) store(x + 16 * i, out[i]);
  }
};

// A query against keys (dot products) and its weighted sum of values. D > 0 (a multiple of 16):
// query and output row live in vector registers (RowOrder); D = 0: any head_dim, plain loops.
template <int D, typename K>
class QueryRow {
  using Order = RowOrder<D, K>;
  static constexpr int kN = Order::kN;

 public:
  QueryRow(const float* q, int /*dim*/) {
    Order::split(q, q_);
    for (Lanes& r : row_) r = Lanes{};
  }
  // The step's own key and value, float32 rows.
  float own_dot(const float* key) const {
    Lanes k[kN];
    Order::split(key, k);
    return hsum(products(k));
  }
  void own_add(const float* v) {
    Lanes x[kN];
    Order::split(v, x);
    for (int i = 0; i < kN; ++i) row_[i] += x[i];
  }
  // The dot products of the first w (<= 16) of 16 consecutive key rows; lanes past w are 0.
  // A whole block unrolls, its 16 sums in registers.
  [[gnu::always_inline]] Lanes dot16(const K* keys, int w) const {
    Lanes a[16];
    if (w == 16) {
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) a[j] = products(keys + j * D);
    } else {
      for (int j = 0; j < 16; ++j) a[j] = j < w ? products(keys + j * D) : Lanes{};
    }
    return hsum16(a);
  }
  // add(p[j], rows + j * D) for the first w of 16 value rows; a row of weight 0 is not read. The
  // sums run in locals (GCC kept row_ in memory across calls, a store-to-load chain per key that
  // bounded the kernel at about 11 cycles a key), even and odd keys apart: one chain of
  // multiply-adds through the 16 keys waited on each one's latency (6% of the kernel's rate from
  // the cache). each(j) runs for every row j, read or not.
  template <typename F>
  [[gnu::always_inline]] void add16(const float* p, int w, const K* rows, F each) {
    Lanes even[kN], odd[kN];
    for (int i = 0; i < kN; ++i) even[i] = row_[i], odd[i] = Lanes{};
    for (int j = 0; j < w; j += 2) {
      each(j), add(p[j], rows + j * D, even);
      if (j + 1 < w) each(j + 1), add(p[j + 1], rows + (j + 1) * D, odd);
    }
    for (int i = 0; i < kN; ++i) row_[i] = even[i] + odd[i];
  }
  void rescale(float c) {
    for (Lanes& r : row_) r *= c;
  }
  void store(float* out, float scale) const {
    Lanes r[kN];
    for (int i = 0; i < kN; ++i) r[i] = row_[i] * scale;
    Order::merge(r, out);
  }

 private:
  [[gnu::always_inline]] static void add(float p, const K* v, Lanes (&r)[kN]) {
    if (p == 0.0f) return;
    Lanes x[kN];
    Order::load_row(v, x);
    for (int i = 0; i < kN; ++i) r[i] += p * x[i];
  }
  [[gnu::always_inline]] Lanes products(const Lanes (&k)[kN]) const {
    Lanes acc = q_[0] * k[0];
    for (int i = 1; i < kN; ++i) acc += q_[i] * k[i];
    return acc;
  }
  [[gnu::always_inline]] Lanes products(const K* key) const {
    Lanes k[kN];
    Order::load_row(key, k);
    return products(k);
  }

  Lanes q_[kN], row_[kN];
};

template <typename K>
class QueryRow<0, K> {
 public:
  QueryRow(const float* q, int dim) : q_(q), dim_(dim), row_(dim, 0.0f) {}
  float own_dot(const float* key) const { return dot(key); }
  void own_add(const float* v) { add(1.0f, v); }
  template <typename F>
  void add16(const float* p, int w, const K* rows, F each) {
    for (int j = 0; j < w; ++j) {
      each(j);
      if (p[j] != 0.0f) add(p[j], rows + static_cast<long>(j) * dim_);
    }
  }
  Lanes dot16(const K* keys, int w) const {
    Lanes d{};
    for (int j = 0; j < w; ++j) d[j] = dot(keys + static_cast<long>(j) * dim_);
    return d;
  }
  void rescale(float c) {
    for (float& x : row_) x *= c;
  }
  void store(float* out, float scale) const {
    for (int i = 0; i < dim_; ++i) out[i] = row_[i] * scale;
  }

 private:
  float dot(const float* key) const { return fpa::cpu::dot(q_, key, dim_); }
  void add(float p, const float* v) { axpy(p, v, row_.data(), dim_); }
  // bf16 rows are widened first, so that the sums run as they do over float32 rows.
  float dot(const uint16_t* key) const { return dot(widen(key)); }
  void add(float p, const uint16_t* v) { add(p, widen(v)); }
  const float* widen(const uint16_t* x) const {
    for (int i = 0; i < dim_; ++i) wide_[i] = bf16_to_float(x[i]);
    return wide_.data();
  }

  const float* q_;
  const int dim_;
  std::vector<float> row_;
  mutable std::vector<float> wide_ = std::vector<float>(dim_);
};

// The key and value rows of a page in its storage's type.
template <typename K>
std::pair<const K*, const K*> kv_rows(const cache::PageView& pv) {
  if constexpr (std::is_same_v<K, float>) {
    return {pv.k, pv.v};
  } else {
    return {pv.k16, pv.v16};
  }
}

// A stream's pages lie apart in the pool, and the hardware prefetcher starts over at each: the
// kernel read 12-14 GB/s with 2 threads where it reads 25 from contiguous pages. Asking for the
// page two ahead, a key's rows per key (a whole page at once overflows the miss buffers and did
// nothing), brought it to 16-24 GB/s (bench/attention_bench.cc). How far ahead, and into which
// cache, each CPU takes best: on an AMD EPYC two pages ahead into the L1 (into the L2 read 48-50
// GB/s against 53-54, one, three or four pages ahead 46-50); on an Intel Xeon (model 207) four
// pages ahead into the L2 read 28.4-28.9 GB/s from DRAM against 25.9-27.0 (bench/RESULTS.md,
// 2026-12-06, eighth session): into the L1 the rows likely wait for its few fill buffers.
struct RowsAhead {
  size_t pages;
  bool into_l2;
};

RowsAhead rows_ahead() {
  static const RowsAhead ahead =
      __builtin_cpu_is("intel") ? RowsAhead{4, true} : RowsAhead{2, false};
  return ahead;
}

[[gnu::always_inline]] inline void prefetch_field(const cache::PageView& pv) {
  __builtin_prefetch(pv.pos);
  __builtin_prefetch(pv.lvl);
  __builtin_prefetch(pv.m);
}

// Page `at` of the stream's pages followed by those of the stream read next (or by its own last
// page again where none is known): a stream's first pages came from DRAM unasked for, at every
// stream's start.
const cache::PageView& page_ahead(std::span<const cache::PageView> pages,
                                  std::span<const cache::PageView> then, size_t at) {
  if (at < pages.size()) return pages[at];
  if (at - pages.size() < then.size()) return then[at - pages.size()];
  return pages.back();
}

template <typename K>
[[gnu::always_inline]] inline void prefetch_slot(const cache::PageView& pv, int slot, int dim,
                                                 bool into_l2) {
  const auto [k, v] = kv_rows<K>(pv);
  const long row = static_cast<long>(dim) * sizeof(K);
  const char* kr = reinterpret_cast<const char*>(k) + slot * row;
  const char* vr = reinterpret_cast<const char*>(v) + slot * row;
  for (long off = 0; off < row; off += 64) {
    if (into_l2) {
      __builtin_prefetch(kr + off, 0, 2);  // prefetcht1
      __builtin_prefetch(vr + off, 0, 2);
    } else {
      __builtin_prefetch(kr + off);
      __builtin_prefetch(vr + off);
    }
  }
}

// The cached keys' probabilities from their scores s (the softmax's maximum mx and 1 / its
// denominator inv) into their acc, added or stored as the keys' mass rule says.
void record_decode_mass(const CachedKeys& keys, const float* s, float mx, float inv) {
  const int ps = keys.page_slots;
  const bool add = keys.mass.mode == cache::MassRule::Mode::kAdd;
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] < 0) continue;
      pv.acc[j] = (add ? pv.acc[j] : 0.0f) + exp_nonpositive(s[p * ps + j] - mx) * inv;
    }
  }
}

// A template on the head dimension D: with D known (16 ... 128) the loops over it unroll and
// the query and output row stay in registers across keys; D = 0 takes any size. One pass over
// the keys, 16 slots at a time (online softmax: the row is rescaled when the maximum grows), so
// a key's k and v are read once, together; an excluded key's value is not read at all.
template <int D, typename K>
float decode_impl(const float* q, float phi, OwnKey own, Penalty pen, int head_dim,
                  const CachedKeys& keys, float* out, std::span<const cache::PageView> then) {
  const int dim = D > 0 ? D : head_dim;
  const int ps = keys.page_slots;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  // Scores are kept only for the attention mass, which needs the final maximum.
  const bool record = keys.mass.counts(0);
  const RowsAhead rows = rows_ahead();
  float* s = record ? scratch(keys.pages.size() * ps) : nullptr;
  QueryRow<D, K> query(q, dim);
  const float own_score = query.own_dot(own.k) * scale;
  float mx = own_score;
  query.own_add(own.v);
  // The softmax's denominator per lane (the own key's 1 in lane 0), summed at the end: a double
  // added per block was spilled to the stack, a store-to-load chain through every block.
  Lanes z{};
  z[0] = 1.0f;
  // The stream read next: its page views (a line each), which the backend wrote on the other
  // core just before, so each was a transfer from that core's cache at a page's start, one
  // after another; asked for now, they arrive during this stream. A batch-8 step's call went
  // from a median 0.96 to 0.92 ms (bench/RESULTS.md).
  for (const cache::PageView& pv : then) __builtin_prefetch(&pv);
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    const auto [k_rows, v_rows] = kv_rows<K>(pv);
    const cache::PageView& ahead = page_ahead(keys.pages, then, p + rows.pages);
    prefetch_field(ahead);
    for (int j0 = 0; j0 < ps; j0 += 16) {
      const int w = std::min(16, ps - j0);
      // The 16 keys at once: a free slot's row may hold anything, even NaN bits, so its score is
      // chosen over, never computed with.
      const Ints live = load_slots<Ints>(pv.pos + j0, w, -1) >= 0;
      const Lanes m_old = load_slots<Lanes>(pv.m + j0, w, kInf);
      const Ints dips = live & (m_old > phi);
      const Lanes m = dips ? Lanes{} + phi : m_old;
      // Written only where it changed: an unchanged page's field stays clean, not written back.
      if (any(dips)) std::memcpy(pv.m + j0, &m, w * sizeof(float));
      const Lanes dots = query.dot16(k_rows + static_cast<long>(j0) * dim, w);
      // The page ahead's rows, a key's beside each value row read: in the unrolled dot16 GCC
      // gathered the block's 64 prefetches ahead of its loads (a burst the miss buffers drop),
      // and from DRAM the kernel read 46 GB/s where it reads 53 with them here.
      const auto fetch = [&](int j) { prefetch_slot<K>(ahead, j0 + j, dim, rows.into_l2); };
      const Lanes scored = dots * scale - penalty(pen, load_slots<Lanes>(pv.lvl + j0, w, 0.0f), m);
      alignas(64) float sc[16];
      store(sc, live ? scored : Lanes{} - kInf);
      if (s != nullptr) std::copy_n(sc, w, s + p * ps + j0);
      const float block_max = hmax(load(sc));
      if (block_max == -kInf) {
        for (int j = 0; j < w; ++j) fetch(j);
        continue;
      }
      if (block_max > mx) {
        const float shrink = exp_nonpositive(mx - block_max);
        query.rescale(shrink);
        z *= shrink;
        mx = block_max;
      }
      alignas(64) float e[16];
      const Lanes el = exp_lanes(load(sc) - mx);
      std::memcpy(e, &el, sizeof e);
      z += el;
      query.add16(e, w, v_rows + static_cast<long>(j0) * dim, fetch);
    }
  }
  const float inv = 1.0f / hsum(z);
  query.store(out, inv);
  if (!record) return 0.0f;
  record_decode_mass(keys, s, mx, inv);
  return exp_nonpositive(own_score - mx) * inv;
}

// The pages' keys and values as float32 rows for the matrix products: float32 pages as they are,
// bf16 pages widened once per call into a per-thread buffer. Free slots may hold anything (even
// NaN bits); their probability is 0, but 0 * NaN is NaN in a matrix product, so their values
// are cleared (in place for float32 pages: the slots belong to this stream alone).
struct FloatPages {
  std::vector<const float*> k, v;
};

FloatPages float_pages(const CachedKeys& keys, int dim) {
  FloatPages out;
  const size_t row = static_cast<size_t>(keys.page_slots) * dim;
  thread_local std::vector<float> wide;
  const bool bf16 = !keys.pages.empty() && keys.pages[0].k16 != nullptr;
  if (bf16 && wide.size() < 2 * row * keys.pages.size()) wide.resize(2 * row * keys.pages.size());
  for (size_t p = 0; p < keys.pages.size(); ++p) {
    const cache::PageView& pv = keys.pages[p];
    float* k = bf16 ? wide.data() + 2 * p * row : pv.k;
    float* v = bf16 ? k + row : pv.v;
    for (int j = 0; j < keys.page_slots; ++j) {
      float* vj = v + static_cast<long>(j) * dim;
      if (pv.pos[j] < 0) {
        std::fill_n(vj, dim, 0.0f);
      } else if (bf16) {
        for (int d = 0; d < dim; ++d) vj[d] = bf16_to_float(pv.v16[j * dim + d]);
      }
      if (bf16) {
        for (int d = 0; d < dim; ++d) k[j * dim + d] = bf16_to_float(pv.k16[j * dim + d]);
      }
    }
    out.k.push_back(k);
    out.v.push_back(v);
  }
  return out;
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

// Records the probabilities of a block's counted rows (rows t0 ... t0 + rows - 1 of a chunk of
// n; n_old cached keys, then `visible` chunk keys) in the keys' attention mass: added, or under
// kLast those of the chunk's last counted row stored.
void record_mass(const float* s, int t0, int rows, size_t ld, const CachedKeys& keys, int visible,
                 float* chunk_acc, int n) {
  const int ps = keys.page_slots;
  const size_t n_old = keys.pages.size() * ps;
  const bool add = keys.mass.mode == cache::MassRule::Mode::kAdd;
  const int end = std::min(keys.mass.end, n);
  for (int t = std::max(t0, add ? keys.mass.begin : end - 1); t < std::min(t0 + rows, end); ++t) {
    if (!keys.mass.counts(t)) continue;
    const float* row = s + (t - t0) * ld;
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      float* acc = keys.pages[p].acc;
      for (int j = 0; j < ps; ++j) acc[j] = (add ? acc[j] : 0.0f) + row[p * ps + j];
    }
    for (int j = 0; j < visible; ++j) chunk_acc[j] = (add ? chunk_acc[j] : 0.0f) + row[n_old + j];
  }
}

}  // namespace

template <typename K>
float decode_typed(const float* q, float phi, OwnKey own, Penalty pen, int head_dim,
                   const CachedKeys& keys, float* out, std::span<const cache::PageView> then) {
  switch (head_dim) {
    case 16:
      return decode_impl<16, K>(q, phi, own, pen, head_dim, keys, out, then);
    case 32:
      return decode_impl<32, K>(q, phi, own, pen, head_dim, keys, out, then);
    case 64:
      return decode_impl<64, K>(q, phi, own, pen, head_dim, keys, out, then);
    case 128:
      return decode_impl<128, K>(q, phi, own, pen, head_dim, keys, out, then);
    default:
      return decode_impl<0, K>(q, phi, own, pen, head_dim, keys, out, then);
  }
}

float decode_attention(const float* q, float phi, OwnKey own, Penalty pen, int head_dim,
                       const CachedKeys& keys, float* out, std::span<const cache::PageView> then) {
  const bool bf16 = !keys.pages.empty() && keys.pages[0].k16 != nullptr;
  return bf16 ? decode_typed<uint16_t>(q, phi, own, pen, head_dim, keys, out, then)
              : decode_typed<float>(q, phi, own, pen, head_dim, keys, out, then);
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
  const FloatPages pages = float_pages(keys, dim);
  std::fill(chunk_acc, chunk_acc + c.n, 0.0f);
  float prefix_min = kInf;
  for (int t0 = 0; t0 < c.n; t0 += kRows) {
    const int rows = std::min(kRows, c.n - t0), visible = t0 + rows;
    const float* q = c.q + t0 * c.stride;
    float* o = out + t0 * c.stride;
    for (size_t p = 0; p < keys.pages.size(); ++p) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, ps, dim, scale, q, c.stride,
                  pages.k[p], dim, 0.0f, s + p * ps, ld);
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
                  pages.v[p], dim, p == 0 ? 0.0f : 1.0f, o, c.stride);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dim, visible, 1.0f, s + n_old, ld,
                c.v, c.stride, keys.pages.empty() ? 0.0f : 1.0f, o, c.stride);
    record_mass(s, t0, rows, ld, keys, visible, chunk_acc, c.n);
  }
  for (const cache::PageView& pv : keys.pages) {
    for (int j = 0; j < ps; ++j) {
      if (pv.pos[j] >= 0) pv.m[j] = std::min(pv.m[j], prefix_min);
    }
  }
}

}  // namespace fpa::cpu
