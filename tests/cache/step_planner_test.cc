// The step planner on made-up pool states: no model, no cache.
#include "cache/step_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace fpa::cache {
namespace {

constexpr int64_t kStreams = 4;  // layers * heads
constexpr int64_t kSlots = 16;   // a page's slots

// A running request whose every stream opens a page per kSlots tokens past `open` free slots.
PlanEntry entry(bool prefilling, int64_t tokens, int64_t held_pages, int preemptions = 0,
                int64_t open = 0) {
  return {.prefilling = prefilling,
          .tokens = tokens,
          .preemptions = preemptions,
          .held_pages = held_pages,
          .pages_needed = [open](int64_t n) {
            return kStreams * ((std::max<int64_t>(0, n - open) + kSlots - 1) / kSlots);
          }};
}

std::vector<std::pair<size_t, int64_t>> items(const StepPlan& p) {
  std::vector<std::pair<size_t, int64_t>> out;
  for (const StepPlan::Item& it : p.items) out.emplace_back(it.entry, it.tokens);
  return out;
}

using Items = std::vector<std::pair<size_t, int64_t>>;

PoolState pool(int64_t free_pages, std::vector<int64_t> snapshot_pages = {}) {
  return {.free_pages = free_pages, .snapshot_pages = std::move(snapshot_pages)};
}

TEST(StepPlanner, DecodeTokensFirstThenPromptChunksWithinTheBudget) {
  const std::vector<PlanEntry> e = {entry(true, 16, 4), entry(false, 1, 8), entry(true, 16, 0),
                                    entry(false, 1, 8)};
  const StepPlan p = plan_step(pool(100), e, 16);
  // The second prompt chunk would pass the budget of 16 prompt tokens: it waits.
  EXPECT_EQ(items(p), (Items{{1, 1}, {3, 1}, {0, 16}}));
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_TRUE(p.failed.empty());
}

TEST(StepPlanner, PromptChunkShrinksToWhatFitsBeforeAnyoneIsPreempted) {
  // 8 free pages: the decoder takes 4, 4 are left for the chunk: 16 tokens, not 32.
  const std::vector<PlanEntry> e = {entry(false, 1, 8), entry(true, 32, 0)};
  const StepPlan p = plan_step(pool(8), e, 64);
  EXPECT_EQ(items(p), (Items{{0, 1}, {1, 16}}));
  EXPECT_TRUE(p.preempted.empty());
}

TEST(StepPlanner, CachedPrefixesGoFirstLeastRecentlyUsedAndOnlyAsManyAsNeeded) {
  const std::vector<PlanEntry> e = {entry(false, 1, 8), entry(true, 32, 0)};
  const StepPlan p = plan_step(pool(4, {3, 2, 5, 7}), e, 64);
  // The decoder needs 4 (fits), the whole chunk 8 more: 3 + 2 + 5 reclaimed, 7 stays.
  EXPECT_EQ(p.snapshots_reclaimed, 3u);
  EXPECT_EQ(items(p), (Items{{0, 1}, {1, 32}}));
  EXPECT_TRUE(p.preempted.empty());
}

TEST(StepPlanner, APromptChunkWaitsRatherThanPreemptAnOlderDecoder) {
  const std::vector<PlanEntry> e = {entry(true, 16, 0), entry(false, 1, 20)};
  const StepPlan p = plan_step(pool(4), e, 16);
  EXPECT_EQ(items(p), (Items{{1, 1}}));
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_TRUE(p.failed.empty());
}

TEST(StepPlanner, ADecoderThatDoesNotFitPreemptsTheNewestOfTheLeastPreempted) {
  // No free page; each decode token takes 4. The oldest makes room by preempting entry 2 (the
  // newest of those preempted least), then entry 1 by preempting entry 3.
  const std::vector<PlanEntry> e = {entry(false, 1, 8), entry(false, 1, 4, 1), entry(false, 1, 4),
                                    entry(false, 1, 4, 1)};
  const StepPlan p = plan_step(pool(0), e, 16);
  EXPECT_EQ(p.preempted, (std::vector<size_t>{2, 3}));
  EXPECT_EQ(items(p), (Items{{0, 1}, {1, 1}}));
}

TEST(StepPlanner, AVictimPlannedEarlierInTheStepGivesBackItsReservation) {
  // Entry 1 was preempted kMaxPreemptions times: the older entry 0, already planned with 4
  // pages, gives way, and the step holds entry 1 alone (not a stale item of a released one).
  const std::vector<PlanEntry> e = {entry(false, 1, 6), entry(false, 1, 6, kMaxPreemptions)};
  const StepPlan p = plan_step(pool(4), e, 16);
  EXPECT_EQ(p.preempted, (std::vector<size_t>{0}));
  EXPECT_EQ(items(p), (Items{{1, 1}}));
}

TEST(StepPlanner, NoRequestIsPreemptedPastTheCapWhileOthersStep) {
  // A prompt chunk that does not fit waits rather than preempt a younger chunk at the cap, and so
  // does a decoder when every other request is at the cap: the step goes on without them.
  const std::vector<PlanEntry> chunks = {entry(false, 1, 8), entry(true, 16, 0),
                                         entry(true, 16, 8, kMaxPreemptions)};
  const StepPlan p = plan_step(pool(4), chunks, 64);
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(items(p), (Items{{0, 1}}));
  const std::vector<PlanEntry> decoders = {entry(false, 1, 8, kMaxPreemptions),
                                           entry(false, 1, 4, kMaxPreemptions),
                                           entry(false, 1, 4, kMaxPreemptions)};
  const StepPlan q = plan_step(pool(4), decoders, 16);
  EXPECT_TRUE(q.preempted.empty());
  EXPECT_EQ(items(q), (Items{{0, 1}}));
}

TEST(StepPlanner, TheCapYieldsOnlyWhereTheStepWouldStandStill) {
  // Nothing fits and the only one that could give way is at the cap: it gives way once more.
  const std::vector<PlanEntry> e = {entry(true, 16, 0), entry(true, 16, 8, kMaxPreemptions)};
  const StepPlan p = plan_step(pool(0), e, 64);
  EXPECT_EQ(p.preempted, (std::vector<size_t>{1}));
  EXPECT_EQ(items(p), (Items{{0, 16}}));
}

TEST(StepPlanner, OnlyARequestAloneThatCannotFitFails) {
  const StepPlan alone = plan_step(pool(3, {0}), {{entry(false, 1, 9)}}, 16);
  EXPECT_EQ(alone.failed, (std::vector<size_t>{0}));
  EXPECT_TRUE(alone.items.empty());
  // Beside another, the younger gives way instead.
  const std::vector<PlanEntry> two = {entry(false, 1, 9), entry(false, 1, 2)};
  const StepPlan p = plan_step(pool(3), two, 16);
  EXPECT_TRUE(p.failed.empty());
  EXPECT_EQ(p.preempted, (std::vector<size_t>{1}));
  EXPECT_EQ(items(p), (Items{{0, 1}}));
}

TEST(StepPlanner, FitsAloneIsJudgedWithThePolicysEviction) {
  // An fpa sequence holding the whole pool whose streams evicted keys, leaving free slots: its
  // next token takes no page, so it runs on rather than failing.
  const std::vector<PlanEntry> e = {entry(false, 1, 64, 0, /*open=*/3)};
  const StepPlan p = plan_step(pool(0), e, 16);
  EXPECT_TRUE(p.failed.empty());
  EXPECT_EQ(items(p), (Items{{0, 1}}));
}

TEST(Admission, APreemptedRequestWaitsUntilWhatItHeldFitsAgain) {
  Admission a{
      .ahead_pages = 4, .streams = kStreams, .running_ahead = 8, .watermark = 2, .free_pages = 20};
  EXPECT_TRUE(admits(a));   // 4 + 8 + 2 <= 20
  a.high_water_pages = 12;  // it held 12: 12 + 4 + 8 + 2 > 20
  EXPECT_FALSE(admits(a));
  a.reclaimable_pages = 6;  // cached prefixes count as free
  EXPECT_TRUE(admits(a));
}

TEST(NextStepTokens, ChunksOnSoloBoundariesAndGeneratedTokensPerTheRule) {
  // A 40-token prompt in chunks of 16: 16, 16, 8; then decode.
  EXPECT_EQ(next_step_tokens(40, 40, 0, 16, true), 16);
  EXPECT_EQ(next_step_tokens(40, 40, 32, 16, true), 8);
  EXPECT_EQ(next_step_tokens(40, 40, 40, 16, true), 1);
  // Resumed with 30 generated (target 69): chunks where they replay decode...
  EXPECT_EQ(next_step_tokens(40, 69, 32, 16, true), 16);
  EXPECT_EQ(next_step_tokens(40, 69, 48, 16, true), 16);
  EXPECT_EQ(next_step_tokens(40, 69, 64, 16, true), 5);
  // ...else the prompt by chunks and each generated token alone.
  EXPECT_EQ(next_step_tokens(40, 69, 32, 16, false), 8);
  EXPECT_EQ(next_step_tokens(40, 69, 40, 16, false), 1);
  EXPECT_EQ(next_step_tokens(40, 69, 68, 16, false), 1);
}

}  // namespace
}  // namespace fpa::cache
