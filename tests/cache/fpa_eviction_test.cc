// FPA eviction against a brute-force model: a key dies when lvl - m >= tau / beta, m being the
// minimum of phi since its insertion, checked step by step and head by head, for decode steps,
// prefill chunks (both call orders) and with compaction in between.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/stream_access.h"
#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

using testing::expect_consistent;
using testing::key_data;
using testing::live_keys;

constexpr float kInf = std::numeric_limits<float>::infinity();

// The brute-force model of one stream: every live key with its own running minimum.
class BruteForceStream {
 public:
  struct Key {
    float lvl;
    float m;
  };

  // Lowers the m of every live key up to position `up_to` to `phi` (the field went there after
  // them), then drops every key with lvl - m >= threshold.
  int judge(float phi, float threshold, int32_t up_to) {
    int dead = 0;
    for (auto it = live_.begin(); it != live_.end();) {
      if (it->first <= up_to) it->second.m = std::min(it->second.m, phi);
      if (it->second.lvl - it->second.m >= threshold) {
        it = live_.erase(it);
        ++dead;
      } else {
        ++it;
      }
    }
    return dead;
  }
  void insert(int32_t pos, float lvl, float m) { live_[pos] = {lvl, m}; }
  const std::map<int32_t, Key>& live() const { return live_; }

 private:
  std::map<int32_t, Key> live_;
};

// One stream's random walk: phi, and the levels of its keys (free or tied).
struct Walk {
  std::mt19937 rng;
  bool tied;
  float phi = 0.0f;
  std::normal_distribution<float> step{0.0f, 1.0f};
  std::normal_distribution<float> offset{0.0f, 1.5f};

  float advance() { return phi += step(rng); }
  float level() { return tied ? phi : phi + offset(rng); }
};

struct FpaCase {
  bool tied = false;
  bool insert_before_chunk_eviction = true;
};

class FpaEvictionTest : public ::testing::TestWithParam<FpaCase> {
 protected:
  static constexpr CacheShape kShape{.n_layers = 2, .n_heads = 3, .head_dim = 4, .page_slots = 4};
  static constexpr float kBetas[3] = {0.7f, 1.3f, 0.0f};  // head 2: beta = 0 never evicts
  static constexpr float kTau = 3.0f;

  void SetUp() override {
    cache_ = testing::make_cache(kShape, 4000);
    ASSERT_NE(cache_, nullptr);
    PolicyConfig policy;
    policy.tau = kTau;
    auto seq = cache_->add_sequence(policy);
    ASSERT_TRUE(seq.ok()) << seq.status();
    seq_ = *seq;
    for (int s = 0; s < kShape.n_layers * kShape.n_heads; ++s) {
      walks_.push_back(Walk{std::mt19937(1000 + s), GetParam().tied});
    }
    refs_.resize(walks_.size());
  }

  static float threshold(int head) {
    const float beta = kBetas[head];
    return beta > 0.0f ? kTau / beta : std::numeric_limits<float>::quiet_NaN();
  }

  void insert(int layer, int head, int32_t pos, float lvl, float m) {
    const auto k = key_data(kShape.head_dim, pos, 1.0f);
    const auto v = key_data(kShape.head_dim, pos, -1.0f);
    ASSERT_TRUE(
        StreamAccess(*cache_).insert(seq_, layer, head, pos, lvl, k.data(), v.data(), m).ok());
    refs_[static_cast<size_t>(layer * kShape.n_heads + head)].insert(pos, lvl, m);
  }

  // One decode step at `pos`, every stream: evict, then insert (docs/model-format.md).
  void decode_step(int32_t pos) {
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        const size_t s = static_cast<size_t>(l * kShape.n_heads + h);
        const float phi = walks_[s].advance();
        const int freed = StreamAccess(*cache_).evict_for_step(seq_, l, h, phi, kBetas[h], pos);
        EXPECT_EQ(freed, refs_[s].judge(phi, threshold(h), pos - 1))
            << "layer " << l << " head " << h;
        insert(l, h, pos, walks_[s].level(), kInf);
        attend(l, h, phi, pos - 1);
      }
    }
  }

  // A prefill chunk [start, end], evicting before or after its keys go in.
  void chunk(int32_t start, int32_t end) {
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        const size_t s = static_cast<size_t>(l * kShape.n_heads + h);
        std::vector<float> phi, lvl;
        for (int32_t p = start; p <= end; ++p) {
          phi.push_back(walks_[s].advance());
          lvl.push_back(walks_[s].level());
        }
        // m of the chunk's key j: min of phi over (j, end].
        std::vector<float> m(phi.size(), kInf);
        for (size_t j = phi.size() - 1; j-- > 0;) m[j] = std::min(m[j + 1], phi[j + 1]);
        const float min_phi = *std::min_element(phi.begin(), phi.end());
        auto insert_chunk = [&] {
          for (size_t j = 0; j < phi.size(); ++j) {
            insert(l, h, start + static_cast<int32_t>(j), lvl[j], m[j]);
          }
        };
        if (GetParam().insert_before_chunk_eviction) insert_chunk();
        const int freed =
            StreamAccess(*cache_).evict_for_chunk(seq_, l, h, min_phi, kBetas[h], end);
        // Keys before the chunk saw all of its field; the chunk's own keys only their m.
        EXPECT_EQ(freed, refs_[s].judge(min_phi, threshold(h), start - 1))
            << "layer " << l << " head " << h;
        if (!GetParam().insert_before_chunk_eviction) insert_chunk();
        attend(l, h, min_phi, start - 1);
      }
    }
  }

  // What the attention kernel does to the cache: m = min(m, phi) for keys up to `up_to`, and
  // some attention mass, so that moves have distinct data to keep.
  void attend(int layer, int head, float phi, int32_t up_to) {
    for (int32_t page : cache_->pages(seq_, layer, head)) {
      const PageView v = cache_->page(page);
      for (int s = 0; s < kShape.page_slots; ++s) {
        if (v.pos[s] < 0 || v.pos[s] > up_to) continue;
        v.m[s] = std::min(v.m[s], phi);
        v.acc[s] += 0.25f * static_cast<float>(s + 1);
      }
    }
  }

  // Compacts one stream: every move is reported, each moved key keeps its data, and the stream
  // ends on the fewest pages. Returns pages freed.
  int compact_and_check(int layer, int head) {
    const auto before = live_keys(*cache_, seq_, layer, head);
    const size_t pages_before = cache_->pages(seq_, layer, head).size();
    std::map<std::pair<int32_t, int32_t>, int32_t> pos_at;  // (page, slot) -> position
    for (const auto& [pos, key] : before) pos_at[{key.ref.page, key.ref.slot}] = pos;
    const int freed =
        StreamAccess(*cache_).compact(seq_, layer, head, [&](SlotRef from, SlotRef to) {
          auto it = pos_at.find({from.page, from.slot});
          EXPECT_NE(it, pos_at.end()) << "moved a slot that held no key";
          if (it == pos_at.end()) return;
          const int32_t pos = it->second;
          pos_at.erase(it);
          EXPECT_TRUE(pos_at.emplace(std::pair{to.page, to.slot}, pos).second)
              << "moved onto a key";
        });
    const auto after = live_keys(*cache_, seq_, layer, head);
    EXPECT_EQ(after.size(), before.size());
    for (const auto& [pos, key] : after) {
      const auto& old = before.at(pos);
      EXPECT_EQ((pos_at[{key.ref.page, key.ref.slot}]), pos) << "a move was not reported";
      EXPECT_EQ(key.lvl, old.lvl);
      EXPECT_EQ(key.m, old.m);
      EXPECT_EQ(key.acc, old.acc);
      EXPECT_EQ(key.k0, old.k0);
      EXPECT_EQ(key.v0, old.v0);
    }
    const size_t slots = static_cast<size_t>(kShape.page_slots);
    const size_t fewest = (before.size() + slots - 1) / slots;
    EXPECT_EQ(cache_->pages(seq_, layer, head).size(), std::min(pages_before, fewest));
    EXPECT_EQ(static_cast<size_t>(freed), pages_before - std::min(pages_before, fewest));
    return freed;
  }

  void expect_matches() {
    std::map<SeqId, int64_t> full{{seq_, full_keys_}};
    expect_consistent(*cache_, full);
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        const auto& ref = refs_[static_cast<size_t>(l * kShape.n_heads + h)].live();
        const auto got = live_keys(*cache_, seq_, l, h);
        ASSERT_EQ(got.size(), ref.size()) << "layer " << l << " head " << h;
        for (const auto& [pos, key] : ref) {
          auto it = got.find(pos);
          ASSERT_NE(it, got.end()) << "key " << pos << " missing, layer " << l << " head " << h;
          EXPECT_EQ(it->second.lvl, key.lvl);
          EXPECT_EQ(it->second.m, key.m);
          EXPECT_EQ(it->second.k0, static_cast<float>(pos));
          EXPECT_EQ(it->second.v0, -static_cast<float>(pos));
        }
      }
    }
  }

  std::unique_ptr<KvCache> cache_;
  SeqId seq_ = -1;
  std::vector<Walk> walks_;
  std::vector<BruteForceStream> refs_;
  int64_t full_keys_ = 0;
};

TEST_P(FpaEvictionTest, DecodeStepsMatchBruteForce) {
  int64_t evicted = 0;
  for (int32_t pos = 0; pos < 400; ++pos) {
    const int64_t before = cache_->stats().evicted_slots;
    decode_step(pos);
    evicted += cache_->stats().evicted_slots - before;
    full_keys_ += kShape.n_layers * kShape.n_heads;
    expect_matches();
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(evicted, 400) << "the walk should evict often";
  // Head 2 (beta = 0) keeps everything.
  EXPECT_EQ(refs_[2].live().size(), 400u);
}

TEST_P(FpaEvictionTest, PrefillChunksAndStepsMatchBruteForce) {
  std::mt19937 rng(7);
  int32_t pos = 0;
  while (pos < 500) {
    if (std::uniform_int_distribution<int>(0, 9)(rng) < 3) {
      decode_step(pos);
      ++pos;
    } else {
      const int32_t end = pos + std::uniform_int_distribution<int32_t>(0, 9)(rng);
      chunk(pos, end);
      pos = end + 1;
    }
    full_keys_ = int64_t{pos} * kShape.n_layers * kShape.n_heads;
    expect_matches();
    if (HasFatalFailure()) return;
  }
}

TEST_P(FpaEvictionTest, CompactionKeepsDataAndOrder) {
  std::mt19937 rng(11);
  int freed_pages = 0;
  for (int32_t pos = 0; pos < 400; ++pos) {
    decode_step(pos);
    full_keys_ += kShape.n_layers * kShape.n_heads;
    const int l = std::uniform_int_distribution<int>(0, kShape.n_layers - 1)(rng);
    const int h = std::uniform_int_distribution<int>(0, kShape.n_heads - 1)(rng);
    freed_pages += compact_and_check(l, h);
    expect_matches();
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(freed_pages, 20);
}

INSTANTIATE_TEST_SUITE_P(Levels, FpaEvictionTest,
                         ::testing::Values(FpaCase{false, true}, FpaCase{true, true},
                                           FpaCase{false, false}, FpaCase{true, false}),
                         [](const ::testing::TestParamInfo<FpaCase>& info) {
                           return std::string(info.param.tied ? "Tied" : "Free") +
                                  (info.param.insert_before_chunk_eviction ? "InsertFirst"
                                                                           : "EvictFirst");
                         });

}  // namespace
}  // namespace fpa::cache
