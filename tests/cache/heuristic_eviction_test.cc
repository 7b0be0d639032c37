// window, sinks and h2o against their definitions, step by step and between prefill chunks, at
// the budget max(min_budget, ceil(budget_fraction * length)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cache/kv_cache.h"
#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

using testing::expect_consistent;
using testing::key_data;
using testing::live_keys;
using testing::live_positions;

constexpr CacheShape kShape{.n_layers = 2, .n_heads = 2, .head_dim = 2, .page_slots = 4};

int64_t budget(const PolicyConfig& p, int64_t length) {
  return std::max<int64_t>(p.min_budget,
                           static_cast<int64_t>(std::ceil(p.budget_fraction * float(length))));
}

PolicyConfig heuristic(Policy policy) {
  PolicyConfig p;
  p.policy = policy;
  p.budget_fraction = 0.25f;
  p.min_budget = 8;
  p.sink_tokens = 3;
  p.h2o_recent_share = 0.4f;
  return p;
}

// Positions [lo, hi] as a set (empty when lo > hi).
std::set<int32_t> span_of(int64_t lo, int64_t hi) {
  std::set<int32_t> out;
  for (int64_t p = std::max<int64_t>(lo, 0); p <= hi; ++p) out.insert(static_cast<int32_t>(p));
  return out;
}

// The live set after position `newest` went in, for window and sinks (history-free).
std::set<int32_t> window_or_sinks(const PolicyConfig& p, int32_t newest) {
  const int64_t keep = budget(p, int64_t{newest} + 1);
  if (p.policy == Policy::kWindow) return span_of(newest - keep + 1, newest);
  std::set<int32_t> out = span_of(0, std::min<int64_t>(p.sink_tokens, newest + 1) - 1);
  for (int32_t pos : span_of(newest - (keep - p.sink_tokens) + 1, newest)) out.insert(pos);
  return out;
}

class HeuristicTest : public ::testing::TestWithParam<Policy> {
 protected:
  void SetUp() override {
    cache_ = testing::make_cache(kShape, 2000);
    ASSERT_NE(cache_, nullptr);
    policy_ = heuristic(GetParam());
    auto seq = cache_->add_sequence(policy_);
    ASSERT_TRUE(seq.ok()) << seq.status();
    seq_ = *seq;
  }

  void insert(int l, int h, int32_t pos) {
    const auto k = key_data(kShape.head_dim, pos, 1.0f);
    ASSERT_TRUE(cache_->insert(seq_, l, h, pos, 0.0f, k.data(), k.data()).ok());
  }

  // h2o's brute force: lightest accumulated attention among keys older than the recent window
  // goes first (ties: the older), until `target` keys remain.
  void h2o_reference_evict(std::map<int32_t, float>& live, int64_t target, int32_t newest) {
    const int64_t recent = std::clamp<int64_t>(
        static_cast<int64_t>(
            std::ceil(policy_.h2o_recent_share * float(budget(policy_, int64_t{newest} + 1)))),
        1, budget(policy_, int64_t{newest} + 1));
    while (static_cast<int64_t>(live.size()) > target) {
      auto victim = live.end();
      for (auto it = live.begin(); it != live.end(); ++it) {
        if (it->first > newest - recent) break;
        if (victim == live.end() || it->second < victim->second) victim = it;
      }
      ASSERT_NE(victim, live.end());
      live.erase(victim);
    }
  }

  // The kernel's part for h2o: each live key receives some attention probability.
  void attend(int l, int h, std::map<int32_t, float>& reference, std::mt19937& rng) {
    std::uniform_real_distribution<float> mass(0.0f, 1.0f);
    for (int32_t page : cache_->pages(seq_, l, h)) {
      const PageView v = cache_->page(page);
      for (int s = 0; s < kShape.page_slots; ++s) {
        if (v.pos[s] < 0) continue;
        const float add = mass(rng) * mass(rng);
        v.acc[s] += add;
        reference[v.pos[s]] += add;
      }
    }
  }

  void expect_live(int l, int h, const std::set<int32_t>& want, int32_t newest) {
    EXPECT_EQ(live_positions(*cache_, seq_, l, h), want)
        << policy_name(GetParam()) << " layer " << l << " head " << h << " after " << newest;
  }

  std::unique_ptr<KvCache> cache_;
  PolicyConfig policy_;
  SeqId seq_ = -1;
};

TEST_P(HeuristicTest, DecodeStepsKeepExactlyTheDefinedKeys) {
  std::mt19937 rng(5);
  std::vector<std::map<int32_t, float>> h2o(kShape.n_layers * kShape.n_heads);
  for (int32_t pos = 0; pos < 300; ++pos) {
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        auto& ref = h2o[static_cast<size_t>(l * kShape.n_heads + h)];
        const int freed = cache_->evict_for_step(seq_, l, h, 0.0f, 1.0f, pos);
        const size_t before = ref.size();
        if (GetParam() == Policy::kH2O) h2o_reference_evict(ref, budget(policy_, pos + 1) - 1, pos);
        insert(l, h, pos);
        ref[pos] = 0.0f;
        if (GetParam() == Policy::kH2O) {
          EXPECT_EQ(static_cast<size_t>(freed), before - (ref.size() - 1));
          attend(l, h, ref, rng);
          std::set<int32_t> want;
          for (const auto& [p, acc] : ref) want.insert(p);
          expect_live(l, h, want, pos);
        } else {
          expect_live(l, h, window_or_sinks(policy_, pos), pos);
        }
      }
    }
    expect_consistent(*cache_, {{seq_, int64_t{pos + 1} * kShape.n_layers * kShape.n_heads}});
    if (HasFailure()) return;
  }
  EXPECT_EQ(cache_->sequence_stats(seq_).live_keys,
            budget(policy_, 300) * kShape.n_layers * kShape.n_heads);
}

TEST_P(HeuristicTest, ChunksKeepTheBudgetAtTheChunkEnd) {
  std::mt19937 rng(9);
  std::vector<std::map<int32_t, float>> h2o(kShape.n_layers * kShape.n_heads);
  int32_t pos = 0;
  while (pos < 400) {
    const int32_t end = pos + std::uniform_int_distribution<int32_t>(0, 30)(rng);
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        auto& ref = h2o[static_cast<size_t>(l * kShape.n_heads + h)];
        for (int32_t p = pos; p <= end; ++p) {
          insert(l, h, p);
          ref[p] = 0.0f;
        }
        attend(l, h, ref, rng);
        cache_->evict_for_chunk(seq_, l, h, 0.0f, 1.0f, end);
        if (GetParam() == Policy::kH2O) {
          h2o_reference_evict(ref, budget(policy_, end + 1), end);
          std::set<int32_t> want;
          for (const auto& [p, acc] : ref) want.insert(p);
          expect_live(l, h, want, end);
        } else {
          expect_live(l, h, window_or_sinks(policy_, end), end);
        }
      }
    }
    pos = end + 1;
    expect_consistent(*cache_, {{seq_, int64_t{pos} * kShape.n_layers * kShape.n_heads}});
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, HeuristicTest,
                         ::testing::Values(Policy::kWindow, Policy::kSinks, Policy::kH2O),
                         [](const ::testing::TestParamInfo<Policy>& info) {
                           return std::string(policy_name(info.param));
                         });

TEST(NonePolicy, KeepsEveryKey) {
  auto cache = testing::make_cache(kShape, 200);
  PolicyConfig p;
  p.policy = Policy::kNone;
  const SeqId seq = *cache->add_sequence(p);
  for (int32_t pos = 0; pos < 100; ++pos) {
    EXPECT_EQ(cache->evict_for_step(seq, 1, 1, -1e30f, 1.0f, pos), 0);
    const auto k = key_data(kShape.head_dim, pos, 1.0f);
    ASSERT_TRUE(cache->insert(seq, 1, 1, pos, 1e30f, k.data(), k.data()).ok());
  }
  EXPECT_EQ(cache->evict_for_chunk(seq, 1, 1, -1e30f, 1.0f, 99), 0);
  EXPECT_EQ(live_positions(*cache, seq, 1, 1), span_of(0, 99));
}

}  // namespace
}  // namespace fpa::cache
