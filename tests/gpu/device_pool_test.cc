// Every edit the cache makes to its pool reaches the device through cache::DevicePool alone: an
// emulated device (pool_mirror.h, keeping k and v) built from nothing else holds what the host
// pool holds, slot by slot (k, v, lvl, m, pos), after prompt chunks, decode with eviction and
// compaction, the prefix cache's snapshot and hit (forks), a plain fork, and released sequences
// whose pages others take. The host pool here keeps the keys too, so that it can be compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "cache/kv_cache.h"
#include "cache/layer_update.h"
#include "cache/prefix_cache.h"
#include "tests/gpu/pool_mirror.h"

namespace fpa::cuda {
namespace {

constexpr int kLayers = 2;
constexpr int kHeads = 2;
constexpr int kDim = 4;
constexpr int kSlots = 4;
constexpr int kPages = 400;

// Values no other stream's keys have: k names the key's layer, head and position, v the sequence
// that inserted it, so a stale key left on a page that changed hands shows.
float key_at(int l, int h, int32_t pos, int d) {
  return 1000.0f * static_cast<float>(l * kHeads + h) + static_cast<float>(pos) + 0.25f * d;
}
float value_of(cache::SeqId seq, int d) { return 100.0f * static_cast<float>(seq) + d; }

class DevicePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cache = cache::KvCache::create({kLayers, kHeads, kDim, kSlots}, kPages, true);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    cache_->attach_device(&mirror_);
    cache_->on_fork([this](cache::SeqId from, cache::SeqId to) {  // a fork goes on as its source
      parent_[to] = from;
      seqs_.insert(to);
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kHeads; ++h) walk_[{to, l, h}] = walk_[{from, l, h}];
      }
    });
  }
  void TearDown() override { cache_->on_fork({}); }

  cache::SeqId add() {
    auto seq = cache_->add_sequence(fpa_);
    EXPECT_TRUE(seq.ok()) << seq.status();
    seqs_.insert(*seq);
    return *seq;
  }
  void release(cache::SeqId seq) {
    cache_->release(seq);
    seqs_.erase(seq);
  }

  // One step: each (sequence, tokens) as one batch item, every layer through apply_layer. The
  // field falls by random steps, so keys die and pages empty out.
  void step(const std::vector<std::pair<cache::SeqId, int>>& batch) {
    std::vector<cache::BatchItem> items;
    for (const auto& [seq, len] : batch) {
      items.push_back({seq, std::span(tokens_).first(static_cast<size_t>(len)),
                       static_cast<int32_t>(cache_->length(seq))});
      ASSERT_TRUE(cache_->reserve(seq, len));
    }
    std::uniform_real_distribution<float> fall(-1.2f, 0.4f), spread(-1.0f, 1.0f);
    for (int l = 0; l < kLayers; ++l) {
      std::vector<float> phi, lvl, k, v;
      for (const cache::BatchItem& item : items) {
        for (int t = 0; t < static_cast<int>(item.tokens.size()); ++t) {
          for (int h = 0; h < kHeads; ++h) {
            float& walk = walk_[{item.seq, l, h}];
            phi.push_back(walk += fall(rng_));
            lvl.push_back(walk + spread(rng_));
            for (int d = 0; d < kDim; ++d) {
              k.push_back(key_at(l, h, item.start_pos + t, d));
              v.push_back(value_of(item.seq, d));
            }
          }
        }
      }
      const cache::LayerRows rows{.phi = phi.data(),
                                  .lvl = lvl.data(),
                                  .row_stride = kHeads,
                                  .head_stride = 1,
                                  .k = k.data(),
                                  .v = v.data(),
                                  .kv_stride = kHeads * kDim};
      mirror_.set_rows(k.data(), v.data(), rows.kv_stride);  // the rows the device holds
      absl::StatusOr<int64_t> evicted = cache::apply_layer(*cache_, l, items, beta_, rows);
      ASSERT_TRUE(evicted.ok()) << evicted.status();
    }
    for (const cache::BatchItem& item : items) cache_->unreserve(item.seq);
    check();
  }

  bool in_lineage(cache::SeqId seq, float v0) const {
    for (;;) {
      if (v0 == value_of(seq, 0)) return true;
      auto it = parent_.find(seq);
      if (it == parent_.end()) return false;
      seq = it->second;
    }
  }

  // Every slot of every stream's pages: a key the host holds is on the device as it is on the
  // host; a slot the host freed holds nothing on the device, or the key the host evicted there
  // (the device's kernels retire evicted keys themselves: evictions are not sent).
  void check() {
    for (cache::SeqId seq : seqs_) {
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kHeads; ++h) {
          for (int32_t page : cache_->pages(seq, l, h)) check_page(seq, l, h, page);
        }
      }
    }
  }

  void check_page(cache::SeqId seq, int l, int h, int32_t page) {
    const cache::PageView host = cache_->page(page);
    for (int s = 0; s < kSlots; ++s) {
      const int32_t at = page * kSlots + s;
      const PoolMirror::Slot& dev = mirror_.slot(at);
      const std::span<const float> k = mirror_.k(at), v = mirror_.v(at);
      if (host.pos[s] < 0) {
        if (dev.pos < 0) continue;
        EXPECT_EQ(k[0], key_at(l, h, dev.pos, 0)) << "a stale key of another stream, slot " << at;
        EXPECT_TRUE(in_lineage(seq, v[0])) << "a stale key of another sequence, slot " << at;
        continue;
      }
      ASSERT_EQ(dev.pos, host.pos[s]) << "seq " << seq << " layer " << l << " slot " << at;
      EXPECT_EQ(dev.lvl, host.lvl[s]) << "slot " << at;
      EXPECT_EQ(dev.m, host.m[s]) << "slot " << at;
      EXPECT_TRUE(std::equal(k.begin(), k.end(), host.k + s * kDim)) << "k of slot " << at;
      EXPECT_TRUE(std::equal(v.begin(), v.end(), host.v + s * kDim)) << "v of slot " << at;
    }
  }

  const cache::PolicyConfig fpa_{.policy = cache::Policy::kFpa, .tau = 2.0f};
  const std::vector<float> beta_{1.0f, 0.5f};
  const std::vector<int32_t> tokens_ = std::vector<int32_t>(64, 7);
  std::mt19937 rng_{17};
  std::map<std::tuple<cache::SeqId, int, int>, float> walk_;
  std::map<cache::SeqId, cache::SeqId> parent_;  // fork -> source
  std::set<cache::SeqId> seqs_;                  // every sequence alive, snapshots included
  PoolMirror mirror_{kPages, kSlots, kDim};
  std::unique_ptr<cache::KvCache> cache_;
};

TEST_F(DevicePoolTest, ADeviceBuiltFromTheInterfaceAloneHoldsWhatTheHostHolds) {
  const cache::SeqId a = add(), b = add(), c = add();
  for (int i = 0; i < 3 && !HasFatalFailure(); ++i) step({{a, 6}, {b, 5}, {c, 1}});
  ASSERT_FALSE(HasFatalFailure());
  cache::PrefixCache prefixes(*cache_, 200);
  const std::span<const int32_t> prompt = std::span(tokens_).first(18);
  ASSERT_TRUE(prefixes.offer(a, prompt, fpa_));  // a snapshot: a fork of a
  for (int i = 0; i < 30 && !HasFatalFailure(); ++i) step({{a, 1}, {b, 1}, {c, 1}});
  release(b);  // its pages go back to the pool, keys and all, for the forks below to take
  const std::optional<cache::PrefixCache::Hit> hit = prefixes.take(prompt, fpa_);
  ASSERT_TRUE(hit.has_value());
  ASSERT_EQ(hit->tokens, 18);
  const absl::StatusOr<cache::SeqId> d = cache_->fork(c);
  ASSERT_TRUE(d.ok()) << d.status();
  check();
  for (int i = 0; i < 30 && !HasFatalFailure(); ++i) {
    step({{a, 1}, {c, 1}, {hit->seq, i < 3 ? 4 : 1}, {*d, 1}});
  }
  const cache::CacheStats stats = cache_->stats();
  EXPECT_GT(stats.evicted_slots, 0);
  size_t moves = 0, resets = 0;
  for (const auto& [layer, edits] : mirror_.received().layers) {
    moves += edits.moves.size();
    resets += edits.reset_pages.size();
  }
  EXPECT_GT(moves, 0u) << "the walk should leave sparse pages to compact";
  EXPECT_GT(resets, 0u);
  EXPECT_GT(mirror_.received().fork_copies.size(), 0u);
  prefixes.flush();
}

// What a fork sends: a reset of every page the copy took and a copy of every live key of the
// source into the copy's pages, nothing else.
TEST_F(DevicePoolTest, AForkSendsItsPagesResetsAndOneCopyPerLiveKey) {
  const cache::SeqId a = add();
  for (int i = 0; i < 12 && !HasFatalFailure(); ++i) step({{a, i < 2 ? 5 : 1}});
  ASSERT_FALSE(HasFatalFailure());
  mirror_.forget_received();
  const absl::StatusOr<cache::SeqId> b = cache_->fork(a);
  ASSERT_TRUE(b.ok()) << b.status();
  const PoolMirror::Received& got = mirror_.received();
  EXPECT_TRUE(got.layers.empty());
  std::multiset<int32_t> pages, sources, targets;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      for (int32_t p : cache_->pages(*b, l, h)) pages.insert(p);
      for (int32_t p : cache_->pages(a, l, h)) {
        for (int s = 0; s < kSlots; ++s) {
          if (cache_->page(p).pos[s] >= 0) sources.insert(p * kSlots + s);
        }
      }
    }
  }
  for (int32_t p : pages) {
    for (int s = 0; s < kSlots; ++s) {
      if (cache_->page(p).pos[s] >= 0) targets.insert(p * kSlots + s);
    }
  }
  EXPECT_EQ(std::multiset<int32_t>(got.fork_resets.begin(), got.fork_resets.end()), pages);
  std::multiset<int32_t> from, to;
  for (const cache::SlotCopy& c : got.fork_copies) {
    from.insert(c.from);
    to.insert(c.to);
  }
  EXPECT_EQ(from, sources);
  EXPECT_EQ(to, targets);
  check();
}

}  // namespace
}  // namespace fpa::cuda
