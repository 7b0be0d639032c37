// Forks and the prefix cache: a fork is the same state and goes on exactly as its source does;
// the radix tree finds the longest cached prefix of one policy only, keeps to its share by
// dropping the least recently used snapshot, and leaves no page behind when flushed.
#include "cache/prefix_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/stream_access.h"
#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

using testing::expect_consistent;
using testing::key_data;
using testing::live_keys;

const CacheShape kShape{.n_layers = 2, .n_heads = 2, .head_dim = 4, .page_slots = 4};

PolicyConfig policy(Policy p, float tau = 2.0f) {
  PolicyConfig c;
  c.policy = p;
  c.tau = tau;
  c.budget_fraction = 0.5f;
  return c;
}

// One decode step of every stream with a random field (the same draws for every caller of the
// same rng state).
void step(KvCache& cache, SeqId seq, int32_t pos, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int l = 0; l < kShape.n_layers; ++l) {
    for (int h = 0; h < kShape.n_heads; ++h) {
      const float phi = cache.last_phi(seq, l, h) + n(rng);
      StreamAccess(cache).evict_for_step(seq, l, h, phi, 1.0f, pos);
      const auto k = key_data(kShape.head_dim, pos, 1.0f);
      ASSERT_TRUE(
          StreamAccess(cache).insert(seq, l, h, pos, phi + n(rng), k.data(), k.data()).ok());
      StreamAccess(cache).set_last_phi(seq, l, h, phi);
    }
  }
}

void expect_same_keys(KvCache& cache, SeqId a, SeqId b) {
  for (int l = 0; l < kShape.n_layers; ++l) {
    for (int h = 0; h < kShape.n_heads; ++h) {
      const auto ka = live_keys(cache, a, l, h), kb = live_keys(cache, b, l, h);
      ASSERT_EQ(ka.size(), kb.size());
      for (auto ia = ka.begin(), ib = kb.begin(); ia != ka.end(); ++ia, ++ib) {
        EXPECT_EQ(ia->first, ib->first);
        EXPECT_EQ(ia->second.lvl, ib->second.lvl);
        EXPECT_EQ(ia->second.m, ib->second.m);
        EXPECT_EQ(ia->second.k0, ib->second.k0);
      }
      EXPECT_EQ(cache.last_phi(a, l, h), cache.last_phi(b, l, h));
    }
  }
  EXPECT_EQ(cache.length(a), cache.length(b));
}

TEST(Fork, CopiesTheStateAndGoesOnAsItsSourceDoes) {
  for (Policy p : {Policy::kFpa, Policy::kNone, Policy::kWindow, Policy::kSinks}) {
    auto cache = testing::make_cache(kShape, 256);
    const SeqId a = *cache->add_sequence(policy(p));
    std::mt19937 rng(5);
    for (int32_t pos = 0; pos < 40; ++pos) step(*cache, a, pos, rng);
    const SeqId b = *cache->fork(a);
    EXPECT_EQ(cache->pages_to_fork(a), cache->sequence_stats(b).pages);
    expect_same_keys(*cache, a, b);
    // The same future on both: the same live keys at every step.
    std::mt19937 ra(9), rb(9);
    for (int32_t pos = 40; pos < 80; ++pos) {
      step(*cache, a, pos, ra);
      step(*cache, b, pos, rb);
      expect_same_keys(*cache, a, b);
    }
    expect_consistent(*cache, {{a, 80 * 4}, {b, 80 * 4}});
  }
}

TEST(Fork, NeedsRoomAndChangesNothingWithout) {
  auto cache = testing::make_cache(kShape, 10);
  const SeqId a = *cache->add_sequence(policy(Policy::kNone));
  std::mt19937 rng(1);
  for (int32_t pos = 0; pos < 8; ++pos) step(*cache, a, pos, rng);  // 2 pages a stream: 8
  const CacheStats before = cache->stats();
  EXPECT_EQ(cache->fork(a).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->stats().pages_in_use, before.pages_in_use);
  EXPECT_EQ(cache->stats().sequences, 1);
  EXPECT_EQ(cache->fork(12345).status().code(), absl::StatusCode::kNotFound);
}

// Forking a device pool with no device attached (cache::DevicePool) could copy nothing there:
// refused, not a sequence whose device pages hold another stream's keys. The copy through an
// attached device: tests/gpu/device_pool_test.cc and decode_step_test.cc (emulated), parity_test.cc
// (on a device).
TEST(Fork, RefusedWhenTheKeysLiveOnTheDeviceAndNoDeviceIsAttached) {
  auto cache = KvCache::create(kShape, 64, /*host_storage=*/false);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const SeqId a = *(*cache)->add_sequence(policy(Policy::kNone));
  EXPECT_EQ((*cache)->fork(a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*cache)->stats().sequences, 1);
  (*cache)->release(a);
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  // A sequence that has taken `tokens` (its keys are stand-ins: one decode step a token).
  SeqId run(const std::vector<int32_t>& tokens, const PolicyConfig& p) {
    const SeqId seq = *cache_->add_sequence(p);
    std::mt19937 rng(3);
    for (size_t i = 0; i < tokens.size(); ++i) step(*cache_, seq, static_cast<int32_t>(i), rng);
    return seq;
  }

  std::unique_ptr<KvCache> cache_ = testing::make_cache(kShape, 400);
};

TEST_F(PrefixCacheTest, TakesTheLongestCachedPrefixOfItsOwnPolicy) {
  PrefixCache prefixes(*cache_, 200);
  const PolicyConfig fpa = policy(Policy::kFpa), other_tau = policy(Policy::kFpa, 3.0f);
  const std::vector<int32_t> turn1{1, 2, 3, 4, 5}, turn2{1, 2, 3, 4, 5, 6, 7, 8};
  for (const auto* t : {&turn1, &turn2}) {
    const SeqId s = run(*t, fpa);
    prefixes.offer(s, *t, fpa);
    cache_->release(s);
  }
  EXPECT_EQ(prefixes.stats().snapshots, 2);
  const std::vector<int32_t> turn3{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, fork{1, 2, 3, 4, 5, 9};
  auto hit = prefixes.take(turn3, fpa);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, 8);
  const SeqId cold = run(turn2, fpa);
  expect_same_keys(*cache_, hit->seq, cold);  // the cached state is what a cold run builds
  auto shorter = prefixes.take(fork, fpa);
  ASSERT_TRUE(shorter.has_value());
  EXPECT_EQ(shorter->tokens, 5);
  EXPECT_FALSE(prefixes.take(std::vector<int32_t>{1, 2, 3}, fpa).has_value());
  EXPECT_FALSE(prefixes.take(turn3, other_tau).has_value());  // never across policies
  EXPECT_FALSE(prefixes.take(turn3, policy(Policy::kNone)).has_value());
  const PrefixCacheStats st = prefixes.stats();
  EXPECT_EQ(st.hit_tokens, 8 + 5);
  EXPECT_EQ(st.queried_tokens, 10 + 6 + 3 + 10 + 10);
  const int64_t hit_pages = cache_->sequence_stats(hit->seq).pages;
  EXPECT_EQ(st.pages, hit_pages + cache_->pages_to_fork(shorter->seq));
  prefixes.forget(turn1, fpa);  // superseded: only turn2's state is left
  EXPECT_FALSE(prefixes.take(fork, fpa).has_value());
  EXPECT_EQ(prefixes.stats().snapshots, 1);
  for (SeqId s : {hit->seq, shorter->seq, cold}) cache_->release(s);
  prefixes.flush();
  EXPECT_EQ(cache_->stats().pages_in_use, 0);
  EXPECT_EQ(cache_->stats().sequences, 0);
  EXPECT_EQ(prefixes.stats().pages, 0);
}

TEST_F(PrefixCacheTest, KeepsToItsShareByDroppingTheLeastRecentlyUsed) {
  const PolicyConfig none = policy(Policy::kNone);
  // Each snapshot of 8 tokens holds 2 pages in each of 4 streams: 8 pages; the share holds two.
  PrefixCache prefixes(*cache_, 17);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 3; ++i) prompts.push_back({100 + i, 1, 2, 3, 4, 5, 6, 7});
  for (int i = 0; i < 2; ++i) {
    const SeqId s = run(prompts[i], none);
    prefixes.offer(s, prompts[i], none);
    cache_->release(s);
  }
  std::vector<int32_t> longer = prompts[0];
  longer.push_back(9);
  auto hit = prefixes.take(longer, none);  // prompt 0 is now the most recently used
  ASSERT_TRUE(hit.has_value());
  cache_->release(hit->seq);
  const SeqId s = run(prompts[2], none);
  prefixes.offer(s, prompts[2], none);
  cache_->release(s);
  EXPECT_EQ(prefixes.stats().snapshots, 2);
  EXPECT_EQ(prefixes.stats().evictions, 1);
  EXPECT_LE(prefixes.stats().pages, 17);
  longer = prompts[1];
  longer.push_back(9);
  EXPECT_FALSE(prefixes.take(longer, none).has_value());  // the least recently used went
  EXPECT_TRUE(prefixes.reclaim_one());
  EXPECT_TRUE(prefixes.reclaim_one());
  EXPECT_FALSE(prefixes.reclaim_one());
  EXPECT_EQ(cache_->stats().pages_in_use, 0);
}

// A "regenerate": a finished request cached prompt + output, and the same prompt comes again and
// is offered while the share is full. Making room drops the longer state on the offered path;
// the branch being filled must survive that (under ASan the old code wrote to a freed node).
TEST_F(PrefixCacheTest, OffersAPrefixOfACachedStateWhenTheShareIsFull) {
  const PolicyConfig none = policy(Policy::kNone);
  PrefixCache prefixes(*cache_, 10);  // the 8-token state's 8 pages fill it
  const std::vector<int32_t> answer{1, 2, 3, 4, 5, 6, 7, 8}, prompt{1, 2, 3, 4};
  const SeqId full = run(answer, none);
  ASSERT_TRUE(prefixes.offer(full, answer, none));
  cache_->release(full);
  const SeqId again = run(prompt, none);  // 1 page a stream: 4 more than the share has
  ASSERT_TRUE(prefixes.offer(again, prompt, none));
  cache_->release(again);
  EXPECT_EQ(prefixes.stats().snapshots, 1);
  EXPECT_EQ(prefixes.stats().evictions, 1);
  auto hit = prefixes.take(answer, none);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, 4);
  cache_->release(hit->seq);
  EXPECT_TRUE(prefixes.reclaim_one());
  EXPECT_FALSE(prefixes.reclaim_one());
  EXPECT_EQ(prefixes.stats().trees, 0);
  EXPECT_EQ(cache_->stats().pages_in_use, 0);
}

// Trees are keyed by client-chosen bits (tau): a lookup makes none and an emptied tree goes, so
// the trees are bounded by the snapshots, whatever clients send.
TEST_F(PrefixCacheTest, KeepsATreeOnlyWhileItHoldsASnapshot) {
  PrefixCache prefixes(*cache_, 200);
  const std::vector<int32_t> tokens{1, 2, 3};
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(prefixes.take(tokens, policy(Policy::kFpa, 1.0f + 0.01f * i)).has_value());
  }
  EXPECT_EQ(prefixes.stats().trees, 0);
  for (float tau : {2.0f, 3.0f}) {
    const SeqId s = run(tokens, policy(Policy::kFpa, tau));
    ASSERT_TRUE(prefixes.offer(s, tokens, policy(Policy::kFpa, tau)));
    cache_->release(s);
  }
  EXPECT_EQ(prefixes.stats().trees, 2);
  prefixes.forget(tokens, policy(Policy::kFpa, 2.0f));
  EXPECT_EQ(prefixes.stats().trees, 1);
  auto hit = prefixes.take(tokens, policy(Policy::kFpa, 3.0f));
  ASSERT_TRUE(hit.has_value());
  cache_->release(hit->seq);
}

// What the running sequences hold is the pool less the snapshots, which never run: the
// figures CacheStats and the fpa_cache_* gauges report.
TEST_F(PrefixCacheTest, RunningFiguresLeaveTheSnapshotsOut) {
  PrefixCache prefixes(*cache_, 200);
  const PolicyConfig fpa = policy(Policy::kFpa);
  const std::vector<int32_t> done{1, 2, 3, 4, 5, 6}, running{7, 8, 9};
  const SeqId finished = run(done, fpa);
  const SequenceStats held = cache_->sequence_stats(finished);
  ASSERT_TRUE(prefixes.adopt(finished, done, fpa));
  const SeqId live = run(running, fpa);
  const SequenceStats own = cache_->sequence_stats(live);
  const auto [s, cached] = held_stats(*cache_, &prefixes);
  EXPECT_EQ(cached.live_keys, held.live_keys);
  EXPECT_EQ(cached.full_keys, held.full_keys);
  EXPECT_EQ(s.sequences, 1);
  EXPECT_EQ(s.pages_in_use, own.pages);
  EXPECT_EQ(s.live_slots, own.live_keys);
  EXPECT_EQ(s.full_cache_keys, own.full_keys);
  EXPECT_EQ(held_stats(*cache_, nullptr).running.sequences, 2);  // no prefix cache: all runs
  cache_->release(live);
  prefixes.flush();
  EXPECT_EQ(prefixes.stats().live_keys, 0);
  const CacheStats idle = held_stats(*cache_, &prefixes).running;
  EXPECT_EQ(idle.live_slots, 0);
  EXPECT_EQ(idle.pages_in_use, 0);
}

// The scheduler's thread makes and drops snapshots while the metrics scrape and CacheStats read
// the figures on theirs: a reader must never see a snapshot half made (in the pool, not yet
// cached: two running sequences) or half dropped (none).
TEST_F(PrefixCacheTest, RunningFiguresHoldWhileSnapshotsComeAndGo) {
  PrefixCache prefixes(*cache_, 200);
  const PolicyConfig fpa = policy(Policy::kFpa);
  const std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const SeqId live = run(tokens, fpa);
  const SequenceStats own = cache_->sequence_stats(live);
  std::atomic<bool> done = false;
  std::thread scheduler([&] {
    for (int i = 0; i < 3000; ++i) {
      ASSERT_TRUE(prefixes.offer(live, tokens, fpa));
      prefixes.flush();
    }
    done = true;
  });
  int64_t reads = 0, wrong = 0;
  while (!done) {
    const CacheStats s = held_stats(*cache_, &prefixes).running;
    wrong += s.sequences != 1 || s.pages_in_use != own.pages || s.live_slots != own.live_keys;
    ++reads;
  }
  scheduler.join();
  EXPECT_EQ(wrong, 0) << "of " << reads << " reads";
  cache_->release(live);
}

}  // namespace
}  // namespace fpa::cache
