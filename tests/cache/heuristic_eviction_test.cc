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
#include "cache/layer_update.h"
#include "cache/stream_access.h"
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
    ASSERT_TRUE(StreamAccess(*cache_).insert(seq_, l, h, pos, 0.0f, k.data(), k.data()).ok());
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
        const int freed = StreamAccess(*cache_).evict_for_step(seq_, l, h, 0.0f, 1.0f, pos);
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
        StreamAccess(*cache_).evict_for_chunk(seq_, l, h, 0.0f, 1.0f, end);
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

// A key's data at `pos`: a point on a spiral, so that queries attend to the keys unevenly.
std::vector<float> spiral_key(int32_t pos) {
  const float r = 1.0f + 0.01f * static_cast<float>(pos);
  return {r * std::cos(0.7f * static_cast<float>(pos)),
          r * std::sin(0.7f * static_cast<float>(pos))};
}

// The softmax of a query over the keys at `positions` (q . k, the keys' spiral data), by position:
// the attention probabilities, computed here in double as a reference.
std::map<int32_t, double> probabilities(const std::vector<float>& q,
                                        const std::set<int32_t>& positions) {
  std::map<int32_t, double> p;
  double z = 0.0;
  for (int32_t pos : positions) {
    const std::vector<float> k = spiral_key(pos);
    z += p[pos] = std::exp(double(q[0]) * k[0] + double(q[1]) * k[1]);
  }
  for (auto& [pos, x] : p) x /= z;
  return p;
}

// Writes each live key's acc from `mass` (by position): what the kernels record.
void write_mass(KvCache& cache, SeqId seq, int l, int h, const std::map<int32_t, double>& mass) {
  for (int32_t page : cache.pages(seq, l, h)) {
    const PageView v = cache.page(page);
    for (int s = 0; s < cache.shape().page_slots; ++s) {
      if (v.pos[s] >= 0) v.acc[s] = static_cast<float>(mass.at(v.pos[s]));
    }
  }
}

class MassPolicyTest : public ::testing::Test {
 protected:
  SeqId start(PolicyConfig p) {
    policy_ = p;
    auto seq = cache_->add_sequence(p);
    EXPECT_TRUE(seq.ok()) << seq.status();
    return seq.ok() ? *seq : -1;
  }
  void insert(SeqId seq, int l, int h, int32_t pos) {
    const std::vector<float> k = spiral_key(pos);
    ASSERT_TRUE(StreamAccess(*cache_).insert(seq, l, h, pos, 0.0f, k.data(), k.data()).ok());
  }
  std::vector<float> query(std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    return {normal(rng), normal(rng)};
  }

  std::unique_ptr<KvCache> cache_ = testing::make_cache(kShape, 4000);
  PolicyConfig policy_;
};

// TOVA: after every decode step or prompt chunk, each stream holds exactly its budget, and the
// keys that died are the ones the step's last query gave the least probability, the step's own
// keys included (a decode token's key goes in first and competes: layer_update's order).
TEST_F(MassPolicyTest, TovaDropsTheKeysTheLastQueryAttendedLeast) {
  PolicyConfig p = heuristic(Policy::kTova);
  const SeqId seq = start(p);
  std::mt19937 rng(13);
  std::vector<std::set<int32_t>> ref(kShape.n_layers * kShape.n_heads);
  int new_key_died = 0;
  for (int32_t pos = 0; pos < 300;) {
    const int32_t len = std::uniform_int_distribution<int32_t>(1, 6)(rng), end = pos + len - 1;
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        std::set<int32_t>& want = ref[static_cast<size_t>(l * kShape.n_heads + h)];
        for (int32_t t = pos; t <= end; ++t) insert(seq, l, h, t), want.insert(t);
        const std::map<int32_t, double> prob = probabilities(query(rng), want);
        write_mass(*cache_, seq, l, h, prob);
        if (len == 1) {
          StreamAccess(*cache_).evict_for_step(seq, l, h, 0.0f, 1.0f, end);
        } else {
          StreamAccess(*cache_).evict_for_chunk(seq, l, h, 0.0f, 1.0f, end);
        }
        const auto budget_now = static_cast<size_t>(budget(p, int64_t{end} + 1));
        while (want.size() > budget_now) {
          const int32_t victim = *std::min_element(want.begin(), want.end(), [&](auto a, auto b) {
            return float(prob.at(a)) < float(prob.at(b));  // as the cache compares them
          });
          new_key_died += len == 1 && victim == end;
          want.erase(victim);
        }
        EXPECT_EQ(live_positions(*cache_, seq, l, h), want) << "after " << end;
        EXPECT_EQ(want.size(), std::min<size_t>(budget_now, size_t(end) + 1));
      }
    }
    pos = end + 1;
    if (HasFailure()) return;
  }
  EXPECT_GT(new_key_died, 0) << "a decode token's own key should sometimes be the lightest";
}

// SnapKV max-pooling by brute force: the max of `mass` over positions within `radius` of `pos`
// (only those below `end`).
double pooled(const std::map<int32_t, double>& mass, int32_t pos, int radius, int32_t end) {
  double best = -1.0;
  for (int32_t j = std::max(0, pos - radius); j <= std::min(end - 1, pos + radius); ++j) {
    best = std::max(best, double(float(mass.at(j))));  // the cache holds float masses
  }
  return best;
}

// SnapKV: nothing dies while the prompt is read (in chunks and single tokens); at its end each
// stream holds its budget: the window and the prompt keys with the highest pooled window mass;
// then every decode step drops the lowest-scored prompt key left, and once none is left the
// oldest key. A fork taken midway goes on alike.
TEST_F(MassPolicyTest, SnapKvKeepsTheTopPooledPromptKeysAndTheWindow) {
  PolicyConfig p = heuristic(Policy::kSnapKV);
  p.snapkv_window = 8;
  p.snapkv_pool = 5;
  p.prompt_tokens = 61;
  const SeqId seq = start(p);
  const int32_t scored_end = 61 - 8;
  std::mt19937 rng(17);
  const size_t streams = kShape.n_layers * kShape.n_heads;
  std::vector<std::map<int32_t, double>> mass(streams);  // window queries' mass, by position
  std::vector<std::set<int32_t>> ref(streams);
  for (int32_t pos = 0; pos < 61;) {
    const int32_t end =
        std::min<int32_t>(60, pos + std::uniform_int_distribution<int32_t>(0, 12)(rng));
    for (int l = 0; l < kShape.n_layers; ++l) {
      for (int h = 0; h < kShape.n_heads; ++h) {
        const size_t st = static_cast<size_t>(l * kShape.n_heads + h);
        for (int32_t t = pos; t <= end; ++t) {
          ref[st].insert(t);
          mass[st][t] = 0.0;
          if (t < scored_end) continue;  // a window query: its probabilities count
          std::set<int32_t> visible(ref[st].begin(), ref[st].upper_bound(t));
          for (const auto& [j, x] : probabilities(query(rng), visible)) mass[st][j] += x;
        }
        if (end == pos) {  // the kernels recorded the mass before the cache evicts
          write_mass(*cache_, seq, l, h, mass[st]);
          StreamAccess(*cache_).evict_for_step(seq, l, h, 0.0f, 1.0f, end);
          insert(seq, l, h, end);
        } else {
          for (int32_t t = pos; t <= end; ++t) insert(seq, l, h, t);
        }
        write_mass(*cache_, seq, l, h, mass[st]);
        if (end > pos) StreamAccess(*cache_).evict_for_chunk(seq, l, h, 0.0f, 1.0f, end);
        if (end < 60) {
          EXPECT_EQ(live_positions(*cache_, seq, l, h), ref[st]) << "before the end";
        }
      }
    }
    pos = end + 1;
  }
  // The scored keys by pooled mass, lowest first (the order they die in).
  std::vector<std::vector<int32_t>> order(streams);
  for (size_t st = 0; st < streams; ++st) {
    for (int32_t j = 0; j < scored_end; ++j) order[st].push_back(j);
    std::stable_sort(order[st].begin(), order[st].end(), [&](int32_t a, int32_t b) {
      return pooled(mass[st], a, 2, scored_end) < pooled(mass[st], b, 2, scored_end);
    });
  }
  // The victims down to `keep` keys: the lowest-scored prompt keys left, then the oldest keys.
  auto drop_to = [&](size_t st, int64_t keep) {
    std::set<int32_t>& want = ref[st];
    for (auto it = order[st].begin(); it != order[st].end() && int64_t(want.size()) > keep; ++it) {
      want.erase(*it);
    }
    while (int64_t(want.size()) > keep) want.erase(want.begin());
  };
  for (size_t st = 0; st < streams; ++st) {
    drop_to(st, budget(p, 61));
    EXPECT_EQ(live_positions(*cache_, seq, int(st) / kShape.n_heads, int(st) % kShape.n_heads),
              ref[st])
        << "at the prompt's end";
  }
  SeqId fork = -1;
  for (int32_t pos = 61; pos <= 260; ++pos) {
    if (pos == 120) fork = *cache_->fork(seq);
    for (size_t st = 0; st < streams; ++st) {
      const int l = int(st) / kShape.n_heads, h = int(st) % kShape.n_heads;
      drop_to(st, budget(p, pos + 1) - 1);
      ref[st].insert(pos);
      for (SeqId s : {seq, fork}) {
        if (s < 0) continue;
        StreamAccess(*cache_).evict_for_step(s, l, h, 0.0f, 1.0f, pos);
        insert(s, l, h, pos);
        EXPECT_EQ(live_positions(*cache_, s, l, h), ref[st]) << "sequence " << s << " at " << pos;
      }
      EXPECT_EQ(int64_t(ref[st].size()), budget(p, pos + 1));
    }
    if (HasFailure()) return;
  }
  EXPECT_GE(*ref[0].begin(), scored_end) << "the steps should outlast the scored keys";
}

// apply_layer's decode order for tova: the new key goes in with the mass its own query gave it
// and competes, so it dies when it is the lightest; otherwise the lightest cached key dies.
TEST(TovaLayer, TheNewKeyCompetesWithTheCachedOnes) {
  auto cache = testing::make_cache(kShape, 100);
  const SeqId seq =
      *cache->add_sequence({.policy = Policy::kTova, .budget_fraction = 0.01f, .min_budget = 8});
  const int heads = kShape.n_heads, dim = kShape.head_dim;
  const std::vector<float> beta(heads, 0.0f), zero(8 * heads, 0.0f), kv(8 * heads * dim, 1.0f);
  auto step = [&](int32_t pos, int len, const std::vector<float>& acc) {
    const std::vector<int32_t> tokens(static_cast<size_t>(len), 0);  // the cache reads no token
    const BatchItem item{seq, tokens, pos};
    const LayerRows rows{zero.data(), zero.data(), acc.data(), heads,
                         1,           kv.data(),   kv.data(),  heads * dim};
    auto evicted = apply_layer(*cache, 0, {&item, 1}, beta, rows);
    EXPECT_TRUE(evicted.ok()) << evicted.status();
    return evicted.ok() ? *evicted : -1;
  };
  std::vector<float> prompt_mass(8 * heads);
  for (int i = 0; i < 8 * heads; ++i) prompt_mass[i] = 0.1f + 0.01f * float(i);
  EXPECT_EQ(step(0, 8, prompt_mass), 0);
  EXPECT_EQ(step(8, 1, std::vector<float>(heads, 0.001f)), heads);
  EXPECT_EQ(live_positions(*cache, seq, 0, 1), span_of(0, 7));
  EXPECT_EQ(step(9, 1, std::vector<float>(heads, 0.5f)), heads);
  std::set<int32_t> want = span_of(1, 7);
  want.insert(9);
  EXPECT_EQ(live_positions(*cache, seq, 0, 0), want);  // position 0 had the least mass
}

TEST(NonePolicy, KeepsEveryKey) {
  auto cache = testing::make_cache(kShape, 200);
  PolicyConfig p;
  p.policy = Policy::kNone;
  const SeqId seq = *cache->add_sequence(p);
  for (int32_t pos = 0; pos < 100; ++pos) {
    EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 1, 1, -1e30f, 1.0f, pos), 0);
    const auto k = key_data(kShape.head_dim, pos, 1.0f);
    ASSERT_TRUE(StreamAccess(*cache).insert(seq, 1, 1, pos, 1e30f, k.data(), k.data()).ok());
  }
  EXPECT_EQ(StreamAccess(*cache).evict_for_chunk(seq, 1, 1, -1e30f, 1.0f, 99), 0);
  EXPECT_EQ(live_positions(*cache, seq, 1, 1), span_of(0, 99));
}

}  // namespace
}  // namespace fpa::cache
