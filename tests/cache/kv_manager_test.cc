// The KV manager without a model: admission (exact under none), the step's reservation (cached
// prefixes reclaimed before anyone is preempted, a victim's pages back with its high-water mark),
// a finished sequence becoming the cached state itself (no copy), and the regenerate sequence
// (the same prompt again while the share is full), which cache_tests_asan runs under ASan.
#include "cache/kv_manager.h"

#include <gtest/gtest.h>

#include <vector>

#include "cache/layer_update.h"
#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

const CacheShape kShape{.n_layers = 2, .n_heads = 2, .head_dim = 4, .page_slots = 4};
constexpr int64_t kStreams = 4;  // layers * heads: a sequence's first token opens a page in each

PolicyConfig policy(Policy p) {
  PolicyConfig c;
  c.policy = p;
  c.tau = 2.0f;
  c.budget_fraction = 0.5f;
  return c;
}

// Appends `n` keys to r's sequence as one prompt chunk through the layer update, the cache's one
// path for a step: phi 0 and level -position, so that fpa evicts nothing.
void feed(KvCache& cache, const KvRequest& r, int n) {
  const auto start = static_cast<int32_t>(cache.length(r.seq));
  std::vector<float> phi(static_cast<size_t>(n * kShape.n_heads), 0.0f), lvl(phi.size());
  std::vector<float> kv(phi.size() * kShape.head_dim, 1.0f);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < kShape.n_heads; ++h) lvl[t * kShape.n_heads + h] = -float(start + t);
  }
  const LayerRows rows{.phi = phi.data(),
                       .lvl = lvl.data(),
                       .row_stride = kShape.n_heads,
                       .head_stride = 1,
                       .k = kv.data(),
                       .v = kv.data(),
                       .kv_stride = kShape.n_heads * kShape.head_dim};
  const std::vector<int32_t> ids(static_cast<size_t>(n), 1);  // the layer update reads no id
  const BatchItem item{.seq = r.seq, .tokens = ids, .start_pos = start};
  const std::vector<float> beta(kShape.n_heads, 1.0f);
  for (int l = 0; l < kShape.n_layers; ++l) {
    ASSERT_TRUE(apply_layer(cache, l, {&item, 1}, beta, rows).ok());
  }
}

std::vector<int32_t> tokens(int32_t first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// A request that prefills `context` (the prompt, its first `prompt` tokens), offers its prompt's
// state as the scheduler does after the first token, decodes the rest and finishes.
void serve(KvManager& kv, KvCache& cache, KvRequest& r, const std::vector<int32_t>& context) {
  const auto prompt = static_cast<size_t>(r.prompt_tokens);
  absl::StatusOr<int64_t> cached = kv.admit(r, {.context = context});
  ASSERT_TRUE(cached.ok()) << cached.status();
  feed(cache, r, static_cast<int>(prompt) - static_cast<int>(*cached));
  kv.offer(r, std::span(context).first(prompt));
  feed(cache, r, static_cast<int>(context.size() - prompt));
  kv.finish(r, context, /*cache_state=*/true);
  EXPECT_EQ(r.seq, -1);
}

TEST(KvManager, FinishedSequenceBecomesTheSnapshotAndServesTheNextTurn) {
  auto cache = testing::make_cache(kShape, 400);
  KvManager kv(*cache, {.prefix_cache_share = 0.5});
  KvRequest turn1(policy(Policy::kFpa), 5, 4);
  const std::vector<int32_t> first = tokens(1, 8);  // 5 prompt + 3 output tokens cached
  ASSERT_TRUE(kv.admit(turn1, {.context = std::span(first).first(5)}).ok());
  feed(*cache, turn1, 5);
  ASSERT_TRUE(kv.offer(turn1, std::span(first).first(5)));
  feed(*cache, turn1, 3);
  const SequenceStats held = kv.sequence_stats(turn1);
  const int64_t in_use = cache->stats().pages_in_use;
  kv.finish(turn1, first, /*cache_state=*/true);
  // The final state superseded the prompt's copy; the sequence itself is the snapshot.
  EXPECT_EQ(kv.prefix_cache()->stats().snapshots, 1);
  EXPECT_EQ(kv.prefix_cache()->stats().pages, held.pages);
  EXPECT_GT(in_use, held.pages);  // the sequence and its prompt's copy
  EXPECT_EQ(cache->stats().pages_in_use, held.pages);
  EXPECT_EQ(kv.reclaimable_pages(), held.pages);

  KvRequest turn2(policy(Policy::kFpa), 10, 4);
  const std::vector<int32_t> second = tokens(1, 10);
  absl::StatusOr<int64_t> cached = kv.admit(turn2, {.context = second});
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 8);
  EXPECT_EQ(cache->length(turn2.seq), 8);
  kv.finish(turn2, std::span(second).first(8), /*cache_state=*/false);
  kv.flush();
  EXPECT_EQ(cache->stats().pages_in_use, 0);
  EXPECT_EQ(cache->stats().sequences, 0);
}

// The pool has no room for a copy of the finished state: finishing makes none, so it is cached
// all the same and the pages in use stay those of the one sequence.
TEST(KvManager, FinishCachesTheStateWithoutRoomForACopy) {
  auto cache = testing::make_cache(kShape, 10);
  KvManager kv(*cache, {.prefix_cache_share = 1.0});
  KvRequest r(policy(Policy::kNone), 4, 5);
  const std::vector<int32_t> context = tokens(1, 8);  // 2 pages a stream: 8 of the 10
  ASSERT_TRUE(kv.admit(r, {.context = std::span(context).first(4)}).ok());
  feed(*cache, r, 8);
  ASSERT_LT(cache->free_pages(), cache->pages_to_fork(r.seq));
  kv.finish(r, context, /*cache_state=*/true);
  EXPECT_EQ(kv.prefix_cache()->stats().snapshots, 1);
  EXPECT_EQ(cache->stats().pages_in_use, 2 * kStreams);
  EXPECT_EQ(cache->stats().sequences, 1);
}

// The same prompt twice with a full share: the second run's prompt is offered while the first
// run's final state (a longer state on the same path) fills the share, so making room drops it.
TEST(KvManager, RegenerateWithAFullShare) {
  auto cache = testing::make_cache(kShape, 400);
  KvManager kv(*cache, {.prefix_cache_share = 10.5 / 400});  // 10 pages: a final state's 8 fill it
  const PolicyConfig none = policy(Policy::kNone);
  std::vector<int32_t> answer = tokens(1, 8), again = tokens(1, 4);
  again.insert(again.end(), {9, 9, 9, 9});
  KvRequest first(none, 4, 5), second(none, 4, 5);
  serve(kv, *cache, first, answer);
  EXPECT_EQ(kv.prefix_cache()->stats().snapshots, 1);
  serve(kv, *cache, second, again);  // a miss: nothing cached is a prefix of its prompt
  EXPECT_EQ(kv.prefix_cache()->stats().snapshots, 1);
  EXPECT_EQ(kv.prefix_cache()->stats().pages, 2 * kStreams);
  KvRequest next(none, 9, 5);
  std::vector<int32_t> turn = again;
  turn.push_back(5);
  absl::StatusOr<int64_t> cached = kv.admit(next, {.context = turn});
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 8);
  kv.preempt(next);
  kv.flush();
  EXPECT_EQ(cache->stats().pages_in_use, 0);
  EXPECT_EQ(kv.prefix_cache()->stats().trees, 0);
}

TEST(KvManager, FitsAloneIsExactUnderNone) {
  auto cache = testing::make_cache(kShape, 12);  // 3 pages a stream
  KvManager kv(*cache, {});
  EXPECT_TRUE(kv.check_fits_alone(KvRequest(policy(Policy::kNone), 8, 5)).ok());  // 12 keys
  EXPECT_EQ(kv.check_fits_alone(KvRequest(policy(Policy::kNone), 8, 6)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(kv.check_fits_alone(KvRequest(policy(Policy::kFpa), 8, 1000)).ok());
}

// Admission counts the whole rest of a running `none` request (its need is exact) and the next
// step of the one asking.
TEST(KvManager, AdmissionCountsWhatTheRunningMayStillTake) {
  auto cache = testing::make_cache(kShape, 120);
  KvManager kv(*cache, {.watermark = 0});
  KvRequest running(policy(Policy::kNone), 4, 100);  // 103 keys: 26 pages a stream, 104 in all
  ASSERT_TRUE(kv.admit(running, {.context = tokens(1, 4)}).ok());
  feed(*cache, running, 4);  // holds 4: 100 ahead, 116 free
  KvRequest small(policy(Policy::kFpa), 16, 8), large(policy(Policy::kFpa), 20, 8);
  small.next_tokens = 16;  // 4 pages a stream
  large.next_tokens = 20;  // 5
  EXPECT_TRUE(kv.can_admit(small));
  EXPECT_FALSE(kv.can_admit(large));
  kv.preempt(running);
  EXPECT_TRUE(kv.can_admit(large));  // an empty batch takes anyone
}

TEST(KvManager, ReserveStepReclaimsCachedPrefixesBeforePreempting) {
  auto cache = testing::make_cache(kShape, 24);
  KvManager kv(*cache, {.watermark = 0, .prefix_cache_share = 1.0});
  KvRequest done(policy(Policy::kNone), 4, 5);
  serve(kv, *cache, done, tokens(50, 8));  // a snapshot of 8 pages
  KvRequest a(policy(Policy::kFpa), 12, 8), b(policy(Policy::kFpa), 4, 8);
  ASSERT_TRUE(kv.admit(a, {.context = tokens(1, 12)}).ok());
  ASSERT_TRUE(kv.admit(b, {.context = tokens(100, 4)}).ok());
  feed(*cache, a, 4);
  feed(*cache, b, 4);  // 8 free: b's decode token takes 4, a's chunk of 8 needs 8 more
  const std::vector<StepAsk> asks = {{.request = &a, .prefilling = true, .tokens = 8},
                                     {.request = &b, .prefilling = false, .tokens = 1}};
  const ReservedStep step = kv.reserve_step(asks, 64);
  EXPECT_EQ(step.plan.snapshots_reclaimed, 1u);
  EXPECT_TRUE(step.plan.preempted.empty());
  EXPECT_TRUE(step.broken.empty());
  ASSERT_EQ(step.plan.items.size(), 2u);
  EXPECT_EQ(kv.prefix_cache()->stats().snapshots, 0);
  EXPECT_EQ(cache->free_pages(), 24 - 8 - 12);  // held, reserved for the step
  for (KvRequest* r : {&a, &b}) kv.finish(*r, {}, false);
  EXPECT_EQ(cache->stats().pages_in_use, 0);
}

TEST(KvManager, AVictimGivesItsPagesBackAndWaitsForWhatItHeld) {
  auto cache = testing::make_cache(kShape, 12);
  KvManager kv(*cache, {.watermark = 0});
  KvRequest a(policy(Policy::kFpa), 4, 8), b(policy(Policy::kFpa), 4, 8);
  for (KvRequest* r : {&a, &b}) {
    ASSERT_TRUE(kv.admit(*r, {.context = tokens(1, 4)}).ok());
    feed(*cache, *r, 4);  // a full page a stream: a decode token opens another in each
  }
  const std::vector<StepAsk> asks = {{.request = &a, .tokens = 1}, {.request = &b, .tokens = 1}};
  const ReservedStep step = kv.reserve_step(asks, 64);
  ASSERT_EQ(step.plan.preempted, std::vector<size_t>{1});  // the younger one
  EXPECT_EQ(b.seq, -1);
  EXPECT_EQ(b.high_water_pages, kStreams);
  EXPECT_EQ(cache->stats().pages_in_use, kStreams);
  // Back with what it held and its next token in every stream: 8 pages, 4 free.
  EXPECT_FALSE(kv.can_admit(b));
  kv.finish(a, {}, false);
  EXPECT_TRUE(kv.can_admit(b));
}

// Under a rule whose chunks do not replay decode a prefilled run computes another state, so the
// final state is not cached: its pages go back.
TEST(KvManager, FinishReleasesWhatCannotServeALaterRun) {
  auto cache = testing::make_cache(kShape, 100);
  KvManager kv(*cache, {.prefix_cache_share = 0.5});
  KvRequest r(policy(Policy::kWindow), 4, 5);
  serve(kv, *cache, r, tokens(1, 8));
  EXPECT_EQ(kv.prefix_cache()->stats().snapshots, 1);  // the prompt's copy only
  EXPECT_EQ(cache->stats().pages_in_use, kv.prefix_cache()->stats().pages);
}

}  // namespace
}  // namespace fpa::cache
