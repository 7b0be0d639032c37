#include "tests/gpu/attention_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>

#include "cache/kv_cache.h"
#include "kernels/cpu/attention.h"
#include "model/bf16.h"

namespace fpa::gpu_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int listed_pages(int spec) { return spec == kAllFreePage ? 1 : spec; }

class Filler {
 public:
  explicit Filler(uint32_t seed) : rng_(seed) {}
  float normal() { return normal_(rng_); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  bool chance(float p) { return uniform(0.0f, 1.0f) < p; }
  std::mt19937& rng() { return rng_; }

 private:
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

// Live keys a query may still see: lvl - m below the threshold, or m = +inf (inserted at the
// previous step). Levels spread over the range the batch's field walks through, so that its
// dips kill some keys and spare others.
void fill_cached_key(AttentionCase& c, size_t slot, int32_t pos, float thr, Filler& f) {
  const size_t hd = c.head_dim;
  for (size_t d = 0; d < hd; ++d) {
    c.k[slot * hd + d] = f.normal();
    c.v[slot * hd + d] = f.normal();
    if (c.bf16) {
      // Rounded to nearest even, as __float2bfloat16 does: the host holds the device's values.
      c.k[slot * hd + d] = through_bf16(c.k[slot * hd + d]);
      c.v[slot * hd + d] = through_bf16(c.v[slot * hd + d]);
    }
  }
  c.pos[slot] = pos;
  c.lvl[slot] = f.uniform(-4.0f, 4.0f);
  const float excess_cap = std::isinf(thr) ? 6.0f : 0.95f * thr;
  c.m[slot] = f.chance(0.1f) ? kInf : c.lvl[slot] - f.uniform(-6.0f, excess_cap);
}

void fill_pool(AttentionCase& c, const CaseSpec& spec, Filler& f) {
  int listed = 0;
  for (const ItemSpec& item : spec.items) {
    for (int p : item.pages) listed += listed_pages(p);
  }
  c.pages = listed + 3;  // a few pages no stream lists: the kernels must leave them alone
  const size_t slots = static_cast<size_t>(c.pages) * c.page_slots;
  c.k.assign(slots * c.head_dim, kNaN);
  c.v.assign(slots * c.head_dim, kNaN);
  c.lvl.assign(slots, kNaN);
  c.m.assign(slots, kNaN);
  c.pos.assign(slots, -1);
  std::vector<int32_t> ids(c.pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), f.rng());
  size_t next_page = 0;
  for (int i = 0; i < c.items; ++i) {
    for (int h = 0; h < c.n_heads; ++h) {
      const int spec_pages = spec.items[i].pages[h];
      c.page_off.push_back(static_cast<int32_t>(c.page_ids.size()));
      c.page_cnt.push_back(listed_pages(spec_pages));
      std::vector<int32_t> positions(c.item_pos0[i]);
      std::iota(positions.begin(), positions.end(), 0);
      std::shuffle(positions.begin(), positions.end(), f.rng());
      size_t next_pos = 0;
      for (int p = 0; p < listed_pages(spec_pages); ++p) {
        const int32_t page = ids[next_page++];
        c.page_ids.push_back(page);
        for (int s = 0; s < c.page_slots; ++s) {
          if (spec_pages == kAllFreePage || !f.chance(0.75f)) continue;
          fill_cached_key(c, static_cast<size_t>(page) * c.page_slots + s, positions[next_pos++],
                          c.thr[i * c.n_heads + h], f);
        }
      }
    }
  }
}

// Each item's field walks on from a random start; levels sit around the walk (free levels).
void fill_rows(AttentionCase& c, Filler& f) {
  c.qkv.resize(static_cast<size_t>(c.rows) * c.qkv_stride);
  for (float& x : c.qkv) x = f.normal();
  const size_t n = static_cast<size_t>(c.rows) * c.n_heads;
  c.phi.resize(n);
  c.lvl_rows.resize(n);
  c.cmin.resize(n);
  for (int i = 0; i < c.items; ++i) {
    for (int h = 0; h < c.n_heads; ++h) {
      float phi = f.uniform(-1.0f, 1.0f);
      float run_min = kInf;
      for (int r = c.item_row0[i]; r < c.item_row0[i] + c.item_len[i]; ++r) {
        phi += f.normal();
        run_min = std::min(run_min, phi);
        c.phi[r * c.n_heads + h] = phi;
        c.lvl_rows[r * c.n_heads + h] = phi + 1.5f * f.normal();
        c.cmin[r * c.n_heads + h] = run_min;
      }
    }
  }
}

std::vector<float> head_column(const std::vector<float>& rows, int n_heads, int h, int row0,
                               int len) {
  std::vector<float> out(len);
  for (int r = 0; r < len; ++r) out[r] = rows[(row0 + r) * n_heads + h];
  return out;
}

}  // namespace

AttentionCase make_case(const CaseSpec& spec) {
  Filler f(spec.seed);
  AttentionCase c;
  c.head_dim = spec.head_dim;
  c.n_heads = static_cast<int>(spec.beta.size());
  c.bf16 = spec.bf16;
  c.beta = spec.beta;
  c.items = static_cast<int>(spec.items.size());
  c.qkv_stride = 3 * c.n_heads * c.head_dim;
  for (int i = 0; i < c.items; ++i) {
    const ItemSpec& item = spec.items[i];
    int most_keys = 0;
    for (int p : item.pages) most_keys = std::max(most_keys, listed_pages(p) * c.page_slots);
    c.item_row0.push_back(c.rows);
    c.item_len.push_back(item.len);
    // Room for every slot's position, and a gap: positions need not be dense.
    c.item_pos0.push_back(most_keys + static_cast<int>(f.uniform(1.0f, 50.0f)));
    for (int r = 0; r < item.len; ++r) c.row_item.push_back(i);
    c.rows += item.len;
    for (float b : spec.beta) c.thr.push_back(b > 0.0f ? spec.tau / b : kInf);
  }
  fill_pool(c, spec, f);
  fill_rows(c, f);
  return c;
}

Expected cpu_expected(const AttentionCase& c) {
  // The CPU kernels write into the pages they read (m, acc, free values): they get copies.
  std::vector<float> k = c.k, v = c.v, lvl = c.lvl, acc(c.m.size(), 0.0f);
  Expected e{std::vector<float>(static_cast<size_t>(c.rows) * c.n_heads * c.head_dim), c.m, c.pos};
  const int hd = c.head_dim, ps = c.page_slots, width = c.n_heads * hd;
  for (int i = 0; i < c.items; ++i) {
    for (int h = 0; h < c.n_heads; ++h) {
      const int stream = i * c.n_heads + h;
      std::vector<cache::PageView> views;
      for (int p = 0; p < c.page_cnt[stream]; ++p) {
        const size_t s0 = static_cast<size_t>(c.page_ids[c.page_off[stream] + p]) * ps;
        views.push_back({k.data() + s0 * hd, v.data() + s0 * hd, lvl.data() + s0, e.m.data() + s0,
                         acc.data() + s0, e.pos.data() + s0});
      }
      const cpu::CachedKeys keys{views, ps, {}};
      const cpu::Penalty pen{c.beta[h], c.thr[stream]};
      const int row0 = c.item_row0[i], len = c.item_len[i];
      const float* q = c.qkv.data() + static_cast<size_t>(row0) * c.qkv_stride + h * hd;
      float* out = e.out.data() + static_cast<size_t>(row0) * width + h * hd;
      if (len == 1) {
        cpu::decode_attention(q, c.phi[row0 * c.n_heads + h], {q + width, q + 2 * width}, pen, hd,
                              keys, out);
      } else {
        const std::vector<float> phi = head_column(c.phi, c.n_heads, h, row0, len);
        const std::vector<float> chunk_lvl = head_column(c.lvl_rows, c.n_heads, h, row0, len);
        const cpu::Chunk chunk{
            q, q + width, q + 2 * width, c.qkv_stride, phi.data(), chunk_lvl.data(), len};
        std::vector<float> rows(static_cast<size_t>(len) * c.qkv_stride), chunk_acc(len);
        cpu::prefill_attention(chunk, pen, hd, keys, rows.data(), chunk_acc.data());
        for (int r = 0; r < len; ++r) {
          std::copy_n(rows.data() + static_cast<size_t>(r) * c.qkv_stride, hd, out + r * width);
        }
      }
      // The CPU kernels only exclude dead keys (the host cache frees them); the device frees
      // them itself, by the cache's rule on the lowered minimum.
      for (const cache::PageView& pv : views) {
        for (int s = 0; s < ps; ++s) {
          if (pv.pos[s] >= 0 && pv.lvl[s] - pv.m[s] >= pen.threshold) pv.pos[s] = -1;
        }
      }
    }
  }
  return e;
}

}  // namespace fpa::gpu_test
