// Helpers for the cache tests: recounting the cache through its public API and comparing the
// recount with its statistics, and reading a stream's live keys.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cache/kv_cache.h"

namespace fpa::cache::testing {

// A live key as the cache holds it.
struct LiveKey {
  SlotRef ref;
  float k0 = 0, v0 = 0, lvl = 0, m = 0, acc = 0;
};

// Live keys of one stream by position (walks pages(), reads every slot).
inline std::map<int32_t, LiveKey> live_keys(KvCache& cache, SeqId seq, int layer, int head) {
  std::map<int32_t, LiveKey> out;
  const int slots = cache.shape().page_slots;
  for (int32_t page : cache.pages(seq, layer, head)) {
    const PageView v = cache.page(page);
    for (int s = 0; s < slots; ++s) {
      if (v.pos[s] < 0) continue;
      const size_t at = static_cast<size_t>(s) * static_cast<size_t>(cache.shape().head_dim);
      LiveKey key{{page, s}, v.k ? v.k[at] : 0.0f, v.v ? v.v[at] : 0.0f, v.lvl[s], v.m[s],
                  v.acc[s]};
      EXPECT_TRUE(out.emplace(v.pos[s], key).second) << "position " << v.pos[s] << " twice";
    }
  }
  return out;
}

inline std::set<int32_t> live_positions(KvCache& cache, SeqId seq, int layer, int head) {
  std::set<int32_t> out;
  for (const auto& [pos, key] : live_keys(cache, seq, layer, head)) out.insert(pos);
  return out;
}

// Recounts pages and live slots of `seqs` (every live sequence of the cache, with the keys a full
// cache would hold for it: the sum over its streams of last position + 1) and checks them against
// stats() and sequence_stats(): no page held empty, none owned twice, the free list the rest.
inline void expect_consistent(KvCache& cache, const std::map<SeqId, int64_t>& seqs) {
  const CacheShape& shape = cache.shape();
  std::set<int32_t> owned;
  int64_t pages = 0, live = 0, full = 0;
  for (const auto& [seq, full_keys] : seqs) {
    int64_t seq_pages = 0, seq_live = 0;
    for (int l = 0; l < shape.n_layers; ++l) {
      for (int h = 0; h < shape.n_heads; ++h) {
        for (int32_t page : cache.pages(seq, l, h)) {
          EXPECT_TRUE(owned.insert(page).second) << "page " << page << " owned twice";
          const PageView v = cache.page(page);
          int in_page = 0;
          for (int s = 0; s < shape.page_slots; ++s) in_page += v.pos[s] >= 0;
          EXPECT_GT(in_page, 0) << "page " << page << " held without a live slot";
          seq_live += in_page;
          ++seq_pages;
        }
      }
    }
    const SequenceStats ss = cache.sequence_stats(seq);
    EXPECT_EQ(ss.live_keys, seq_live) << "sequence " << seq;
    EXPECT_EQ(ss.pages, seq_pages) << "sequence " << seq;
    EXPECT_GE(ss.peak_live_keys, ss.live_keys);
    pages += seq_pages;
    live += seq_live;
    full += full_keys;
  }
  const CacheStats st = cache.stats();
  EXPECT_EQ(st.pages_in_use, pages);
  EXPECT_EQ(st.live_slots, live);
  EXPECT_EQ(st.full_cache_keys, full);
  EXPECT_EQ(st.sequences, static_cast<int64_t>(seqs.size()));
  EXPECT_EQ(cache.free_pages(), st.pages_total - st.pages_in_use);
}

// k and v of a key at `pos`: every component encodes the position (v negated), so a test can
// tell which key a slot holds after moves.
inline std::vector<float> key_data(int head_dim, int32_t pos, float sign) {
  return std::vector<float>(static_cast<size_t>(head_dim), sign * static_cast<float>(pos));
}

inline std::unique_ptr<KvCache> make_cache(CacheShape shape, int64_t pages,
                                           bool host_storage = true) {
  auto cache = KvCache::create(shape, pages, host_storage);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? *std::move(cache) : nullptr;
}

}  // namespace fpa::cache::testing
