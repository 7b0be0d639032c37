// stats() read from another thread while writers decode: every snapshot is a state the cache
// could be in (no torn or impossible values), and writers on different streams of one sequence
// may run side by side.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/page_ledger.h"
#include "cache/stream_access.h"
#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

constexpr CacheShape kShape{.n_layers = 1, .n_heads = 4, .head_dim = 4, .page_slots = 4};

// Decodes `steps` random-walk steps on heads [head_begin, head_end) of `seq`, compacting now
// and then.
void decode(KvCache& cache, SeqId seq, int head_begin, int head_end, int steps, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> phi(kShape.n_heads, 0.0f);
  const auto k = testing::key_data(kShape.head_dim, 1, 1.0f);
  for (int32_t pos = 0; pos < steps; ++pos) {
    for (int h = head_begin; h < head_end; ++h) {
      phi[h] += normal(rng);
      StreamAccess(cache).evict_for_step(seq, 0, h, phi[h], 1.0f, pos);
      ASSERT_TRUE(StreamAccess(cache)
                      .insert(seq, 0, h, pos, phi[h] + normal(rng), k.data(), k.data())
                      .ok());
      if (pos % 64 == 0) StreamAccess(cache).compact(seq, 0, h, {});
    }
  }
}

TEST(Concurrency, StatsReadWhileWritersRun) {
  auto cache = testing::make_cache(kShape, 4096);
  PolicyConfig fpa;
  fpa.tau = 3.0f;
  PolicyConfig window;
  window.policy = Policy::kWindow;
  window.budget_fraction = 0.1f;
  const SeqId a = *cache->add_sequence(fpa);
  const SeqId b = *cache->add_sequence(window);
  const SeqId c = *cache->add_sequence(fpa);
  constexpr int kSteps = 3000;

  std::atomic<bool> done{false};
  int64_t reads = 0;
  std::thread reader([&] {
    CacheStats last = cache->stats();
    while (!done.load()) {
      const CacheStats s = cache->stats();
      ++reads;
      ASSERT_GE(s.pages_in_use, 0);
      ASSERT_LE(s.pages_in_use, s.pages_total);
      ASSERT_LE(s.live_slots, s.pages_in_use * kShape.page_slots);
      ASSERT_GE(s.live_slots, s.pages_in_use);  // no page is held empty
      ASSERT_LE(s.live_slots, s.full_cache_keys);
      ASSERT_LE(s.full_cache_keys, int64_t{3} * kSteps * kShape.n_heads);
      ASSERT_GE(s.evicted_slots, last.evicted_slots);  // monotonic
      ASSERT_GE(s.full_cache_keys, last.full_cache_keys);
      ASSERT_EQ(s.sequences, 3);
      ASSERT_LE(s.bytes_held(), s.pages_total * kShape.page_slots * s.bytes_per_key);
      last = s;
    }
  });
  // Three writers: sequence a alone, sequence b alone, and sequence c split over two threads.
  std::vector<std::thread> writers;
  writers.emplace_back([&] { decode(*cache, a, 0, 4, kSteps, 1); });
  writers.emplace_back([&] { decode(*cache, b, 0, 4, kSteps, 2); });
  writers.emplace_back([&] { decode(*cache, c, 0, 2, kSteps, 3); });
  writers.emplace_back([&] { decode(*cache, c, 2, 4, kSteps, 4); });
  for (std::thread& w : writers) w.join();
  done.store(true);
  reader.join();
  EXPECT_GT(reads, 0);
  const int64_t full = int64_t{kSteps} * kShape.n_heads;
  testing::expect_consistent(*cache, {{a, full}, {b, full}, {c, full}});
  EXPECT_EQ(cache->sequence_stats(c).length, kSteps);
  EXPECT_EQ(cache->sequence_stats(b).live_keys, (kSteps / 10) * kShape.n_heads);
  for (SeqId s : {a, b, c}) cache->release(s);
  EXPECT_EQ(cache->stats().pages_in_use, 0);
  EXPECT_EQ(cache->free_pages(), 4096);
}

// The ledger's regions: a page of the asked-for region while it has one, else one of the region
// with the most free pages; `near` before either; every page once, and the free count exact.
TEST(Ledger, TakesFromTheRegionAskedForThenTheFullest) {
  PageLedger ledger(10, 4, 3);  // regions [0, 4), [4, 8), [8, 10)
  std::vector<int32_t> taken;
  for (int i = 0; i < 2; ++i) taken.push_back(*ledger.take_page({}, nullptr, -1, 2));
  for (int32_t p : taken) EXPECT_TRUE(p == 8 || p == 9) << p;
  EXPECT_EQ(ledger.region_of(9), 2);
  EXPECT_EQ(*ledger.take_page({}, nullptr, 3, 2), 3);  // near wins over the region
  // Region 2 is empty: the fullest is region 1 (4 free) over region 0 (3 free).
  const int32_t spill = *ledger.take_page({}, nullptr, -1, 2);
  EXPECT_EQ(ledger.region_of(spill), 1);
  taken.push_back(3), taken.push_back(spill);
  while (const std::optional<int32_t> p = ledger.take_page({}, nullptr, -1, 0)) taken.push_back(*p);
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(ledger.free_pages(), 0);
  ledger.apply({}, std::vector<int32_t>{9, 0});
  EXPECT_EQ(ledger.free_pages(), 2);
  EXPECT_EQ(*ledger.take_page({}, nullptr, -1, 2), 9);
  EXPECT_EQ(*ledger.take_page({}, nullptr, -1, 2), 0);  // region 2 empty again: region 0's
}

// A page taken from a reservation leaves the reserved count and enters the in-use count as one
// change: a reader never sees it in both or in neither. The writer cycles through (in use,
// reserved) = (0,0), (0,2), (1,1), (2,0), so every consistent snapshot sums to 0 or 2.
TEST(Concurrency, LedgerSnapshotsSeeReservationsMoveAtOnce) {
  PageLedger ledger(8, 4);
  std::atomic<bool> done = false;
  std::thread writer([&] {
    for (int i = 0; i < 400000; ++i) {
      int64_t reservation = 0;
      ASSERT_TRUE(ledger.reserve(&reservation, 2));
      const int32_t a = *ledger.take_page({}, &reservation);
      const int32_t b = *ledger.take_page({}, &reservation);
      const std::vector<int32_t> pages{a, b};
      ledger.apply({}, pages);
    }
    done = true;
  });
  int64_t torn = 0;
  while (!done) {
    const CacheStats s = ledger.snapshot();
    const int64_t sum = s.pages_in_use + s.pages_reserved;
    torn += sum != 0 && sum != 2;
  }
  writer.join();
  EXPECT_EQ(torn, 0);
}

}  // namespace
}  // namespace fpa::cache
