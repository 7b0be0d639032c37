// The page pool: pages freed the step their last key dies, exhaustion as a clean error, storage
// modes and sizes, and no leak after thousands of random operations under every policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/policy.h"
#include "cache/stream_access.h"
#include "model/bf16.h"
#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

using testing::expect_consistent;
using testing::key_data;
using testing::live_positions;

PolicyConfig fpa_policy(float tau) {
  PolicyConfig p;
  p.tau = tau;
  return p;
}

absl::Status insert_key(KvCache& cache, SeqId seq, int l, int h, int32_t pos, float lvl) {
  const auto k = key_data(cache.shape().head_dim, pos, 1.0f);
  return StreamAccess(cache).insert(seq, l, h, pos, lvl, k.data(), k.data()).status();
}

// KvCache::prefetch is a hint: at every step, on streams full, empty, with keys pending and
// without, on a sequence or a stream that does not exist, it reads only what is there (ASan, in
// cache_tests_asan) and changes nothing.
TEST(Pool, PrefetchChangesNothing) {
  const CacheShape shape{.n_layers = 2, .n_heads = 2, .head_dim = 2, .page_slots = 4};
  auto cache = testing::make_cache(shape, 16);
  const SeqId seq = *cache->add_sequence(fpa_policy(1.0f));
  const SeqId empty = *cache->add_sequence(fpa_policy(1.0f));
  // Layer 0 head 0: two full pages and keys in the order; head 1: one key, still pending.
  for (int32_t pos = 0; pos < 8; ++pos) {
    StreamAccess(*cache).evict_for_step(seq, 0, 0, 0.0f, 1.0f, pos);
    ASSERT_TRUE(insert_key(*cache, seq, 0, 0, pos, 0.5f).ok());
  }
  ASSERT_TRUE(insert_key(*cache, seq, 0, 1, 0, 0.5f).ok());
  const CacheStats before = cache->stats();
  const auto positions = live_positions(*cache, seq, 0, 0);
  for (int step = 0; step < 3; ++step) {
    for (const SeqId s : {seq, empty, SeqId{999}}) {
      for (int l = -1; l <= shape.n_layers; ++l) {
        for (int h = -1; h <= shape.n_heads; ++h) StreamAccess(*cache).prefetch(s, l, h, step);
      }
    }
  }
  const CacheStats after = cache->stats();
  EXPECT_EQ(after.pages_in_use, before.pages_in_use);
  EXPECT_EQ(after.live_slots, before.live_slots);
  EXPECT_EQ(live_positions(*cache, seq, 0, 0), positions);
  expect_consistent(*cache, {{seq, 9}, {empty, 0}});
}

TEST(Pool, PageFreedTheStepItsLastKeyDies) {
  const CacheShape shape{.n_layers = 1, .n_heads = 1, .head_dim = 2, .page_slots = 4};
  auto cache = testing::make_cache(shape, 8);
  const SeqId seq = *cache->add_sequence(fpa_policy(1.0f));
  // Keys 0-3 fill page one at level 25, keys 4-7 page two at level 20; the field stays at 30.
  for (int32_t pos = 0; pos < 8; ++pos) {
    EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 0, 0, 30.0f, 1.0f, pos), 0);
    ASSERT_TRUE(insert_key(*cache, seq, 0, 0, pos, pos < 4 ? 25.0f : 20.0f).ok());
  }
  EXPECT_EQ(cache->stats().pages_in_use, 2);
  // phi = 23.5 kills level 25 (25 - 23.5 >= 1), not level 20: page one goes back at once.
  EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 0, 0, 23.5f, 1.0f, 8), 4);
  EXPECT_EQ(cache->stats().pages_in_use, 1);
  EXPECT_EQ(cache->free_pages(), 7);
  EXPECT_EQ(cache->stats().evicted_slots, 4);
  // A dip to 0 kills the rest, before anything new goes in.
  EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 0, 0, 0.0f, 1.0f, 8), 4);
  EXPECT_EQ(cache->stats().pages_in_use, 0);
  EXPECT_TRUE(cache->pages(seq, 0, 0).empty());
  expect_consistent(*cache, {{seq, 8}});
}

TEST(Pool, ExhaustionIsAnErrorAndLeavesTheCacheUsable) {
  const CacheShape shape{.n_layers = 1, .n_heads = 2, .head_dim = 2, .page_slots = 2};
  auto cache = testing::make_cache(shape, 3);
  PolicyConfig none;
  none.policy = Policy::kNone;
  const SeqId a = *cache->add_sequence(none);
  for (int32_t pos = 0; pos < 4; ++pos) ASSERT_TRUE(insert_key(*cache, a, 0, 0, pos, 0.0f).ok());
  ASSERT_TRUE(insert_key(*cache, a, 0, 1, 0, 0.0f).ok());
  ASSERT_TRUE(insert_key(*cache, a, 0, 1, 1, 0.0f).ok());
  EXPECT_EQ(cache->free_pages(), 0);
  EXPECT_EQ(cache->pages_needed(a, 1), 2);  // both heads' pages are full
  const CacheStats before = cache->stats();
  const absl::Status full = insert_key(*cache, a, 0, 1, 2, 0.0f);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("exhausted"), std::string_view::npos) << full;
  const CacheStats after = cache->stats();
  EXPECT_EQ(after.pages_in_use, before.pages_in_use);
  EXPECT_EQ(after.live_slots, before.live_slots);
  EXPECT_EQ(after.full_cache_keys, before.full_cache_keys);
  EXPECT_EQ(live_positions(*cache, a, 0, 1), (std::set<int32_t>{0, 1}));
  expect_consistent(*cache, {{a, 4 + 2}});
  // The failed position can be retried once there is room; another sequence gets the pages back.
  const SeqId b = *cache->add_sequence(none);
  EXPECT_EQ(insert_key(*cache, b, 0, 0, 0, 0.0f).code(), absl::StatusCode::kResourceExhausted);
  cache->release(a);
  EXPECT_EQ(cache->free_pages(), 3);
  EXPECT_TRUE(insert_key(*cache, b, 0, 0, 0, 0.0f).ok());
  expect_consistent(*cache, {{b, 1}});
}

// Streams decoding in step take pages in turn; each should still read its pages in runs of
// consecutive ones (the attention kernel streams them): on a fresh pool every stream grows into
// the pages after its first, and a pool of any size hands out each page exactly once.
TEST(Pool, StreamsGrowIntoConsecutivePages) {
  const CacheShape shape{.n_layers = 1, .n_heads = 3, .head_dim = 2, .page_slots = 2};
  const int64_t num_pages = 99;  // not a multiple of the run length
  auto cache = testing::make_cache(shape, num_pages);
  PolicyConfig none;
  none.policy = Policy::kNone;
  const SeqId seq = *cache->add_sequence(none);
  for (int32_t pos = 0; pos < 2 * 10; ++pos) {  // 10 pages per head, taken in turn
    for (int h = 0; h < 3; ++h) ASSERT_TRUE(insert_key(*cache, seq, 0, h, pos, 0.0f).ok());
  }
  for (int h = 0; h < 3; ++h) {
    const std::span<const int32_t> pages = cache->pages(seq, 0, h);
    ASSERT_EQ(pages.size(), 10u);
    for (size_t i = 1; i < pages.size(); ++i) EXPECT_EQ(pages[i], pages[i - 1] + 1) << h;
  }
  // The rest of the pool: every page once, whatever is left of the runs.
  const SeqId other = *cache->add_sequence(none);
  std::vector<int32_t> seen;
  const int32_t per_head = 2 * (num_pages - 30) / 3;  // the 69 pages left, 46 keys a head
  for (int32_t pos = 0; pos < per_head; ++pos) {
    for (int h = 0; h < 3; ++h) ASSERT_TRUE(insert_key(*cache, other, 0, h, pos, 0.0f).ok());
  }
  for (SeqId s : {seq, other}) {
    for (int h = 0; h < 3; ++h) {
      for (int32_t p : cache->pages(s, 0, h)) seen.push_back(p);
    }
  }
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), static_cast<size_t>(num_pages));
  for (int32_t p = 0; p < num_pages; ++p) EXPECT_EQ(seen[static_cast<size_t>(p)], p);
  EXPECT_EQ(cache->free_pages(), 0);
  expect_consistent(*cache, {{seq, 3 * 20}, {other, 3 * per_head}});
}

// A layer's pages come from its own region of the pool (the decode attention reads one layer's
// streams at a time, faster from one region than from all of it), as long as that region has
// free pages; then from the region with the most, and every page is handed out once.
TEST(Pool, EachLayerTakesPagesFromItsOwnRegion) {
  const CacheShape shape{.n_layers = 3, .n_heads = 2, .head_dim = 2, .page_slots = 2};
  const int64_t num_pages = 60;  // regions of 20: [0, 20), [20, 40), [40, 60)
  auto cache = testing::make_cache(shape, num_pages);
  PolicyConfig none;
  none.policy = Policy::kNone;
  const SeqId seq = *cache->add_sequence(none);
  for (int32_t pos = 0; pos < 2 * 8; ++pos) {  // 8 pages a stream, layers and heads in turn
    for (int l = 0; l < 3; ++l) {
      for (int h = 0; h < 2; ++h) ASSERT_TRUE(insert_key(*cache, seq, l, h, pos, 0.0f).ok());
    }
  }
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int32_t p : cache->pages(seq, l, h)) {
        EXPECT_GE(p, 20 * l) << l << " " << h;
        EXPECT_LT(p, 20 * (l + 1)) << l << " " << h;
      }
    }
  }
  // Layer 0 outgrows its region (4 pages left): the rest come from the regions with the most free.
  const SeqId more = *cache->add_sequence(none);
  for (int32_t pos = 0; pos < 2 * 12; ++pos)
    ASSERT_TRUE(insert_key(*cache, more, 0, 0, pos, 0.0f).ok());
  std::vector<int32_t> seen;
  for (SeqId s : {seq, more}) {
    for (int l = 0; l < 3; ++l) {
      for (int h = 0; h < 2; ++h) {
        for (int32_t p : cache->pages(s, l, h)) seen.push_back(p);
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(cache->free_pages(), num_pages - static_cast<int64_t>(seen.size()));
  expect_consistent(*cache, {{seq, 3 * 2 * 16}, {more, 24}});
}

TEST(Pool, PagesNeededCountsFreeSlotsPerStream) {
  const CacheShape shape{.n_layers = 2, .n_heads = 2, .head_dim = 2, .page_slots = 4};
  auto cache = testing::make_cache(shape, 64);
  const SeqId seq = *cache->add_sequence(fpa_policy(20.0f));
  EXPECT_EQ(cache->pages_needed(seq, 1), 4);
  EXPECT_EQ(cache->pages_needed(seq, 9), 12);
  ASSERT_TRUE(insert_key(*cache, seq, 0, 0, 0, 0.0f).ok());
  EXPECT_EQ(cache->pages_needed(seq, 3), 3);  // stream (0, 0) has 3 free slots
  EXPECT_EQ(cache->pages_needed(seq, 4), 4);
  EXPECT_EQ(cache->pages_needed(seq, 0), 0);
  EXPECT_EQ(cache->pages_needed(12345, 4), 0);
}

// The planner's contract: a reservation holds pages back from everyone else, the sequence's own
// inserts draw on it, and what the step did not use goes back.
TEST(Reserve, HoldsPagesForItsSequenceOnly) {
  const CacheShape shape{.n_layers = 1, .n_heads = 2, .head_dim = 2, .page_slots = 2};
  auto cache = testing::make_cache(shape, 5);
  PolicyConfig none;
  none.policy = Policy::kNone;
  const SeqId a = *cache->add_sequence(none);
  const SeqId b = *cache->add_sequence(none);
  ASSERT_TRUE(cache->reserve(a, 3));  // 2 pages per head
  EXPECT_EQ(cache->stats().pages_reserved, 4);
  EXPECT_EQ(cache->free_pages(), 1);
  EXPECT_TRUE(cache->reserve(a, 3));  // again: the same reservation, nothing more
  EXPECT_EQ(cache->free_pages(), 1);
  EXPECT_FALSE(cache->reserve(b, 3));  // needs 2 of the 1 unreserved page: nothing taken
  EXPECT_EQ(cache->free_pages(), 1);
  EXPECT_FALSE(cache->reserve(12345, 1));
  // b may use the unreserved page, but not a's.
  ASSERT_TRUE(insert_key(*cache, b, 0, 0, 0, 0.0f).ok());
  EXPECT_EQ(insert_key(*cache, b, 0, 1, 0, 0.0f).code(), absl::StatusCode::kResourceExhausted);
  for (int32_t pos = 0; pos < 3; ++pos) {
    for (int h = 0; h < 2; ++h) ASSERT_TRUE(insert_key(*cache, a, 0, h, pos, 0.0f).ok());
  }
  EXPECT_EQ(cache->stats().pages_reserved, 0);
  EXPECT_EQ(cache->stats().pages_in_use, 5);
  cache->release(b);
  ASSERT_TRUE(cache->reserve(a, 1));  // both heads have a free slot: no page needed
  EXPECT_EQ(cache->stats().pages_reserved, 0);
  EXPECT_FALSE(cache->reserve(a, 2));  // a page per head, one is free
  cache->release(a);
  const SeqId c = *cache->add_sequence(none);
  ASSERT_TRUE(cache->reserve(c, 1));
  EXPECT_EQ(cache->stats().pages_reserved, 2);
  EXPECT_EQ(cache->free_pages(), 3);
  cache->unreserve(c);
  EXPECT_EQ(cache->free_pages(), 5);
  ASSERT_TRUE(cache->reserve(c, 1));
  cache->release(c);  // a release hands its reservation back too
  EXPECT_EQ(cache->stats().pages_reserved, 0);
  EXPECT_EQ(cache->free_pages(), 5);
  EXPECT_EQ(cache->stats().pages_in_use, 0);
}

TEST(Pool, BadInputIsAClearError) {
  const CacheShape shape{.n_layers = 1, .n_heads = 1, .head_dim = 2, .page_slots = 4};
  EXPECT_EQ(KvCache::create({.n_layers = 0, .n_heads = 1, .head_dim = 2}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::create(shape, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::create(shape, int64_t{1} << 40).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto cache = testing::make_cache(shape, 4);
  const SeqId seq = *cache->add_sequence(fpa_policy(20.0f));
  const auto k = key_data(2, 0, 1.0f);
  EXPECT_EQ(StreamAccess(*cache).insert(seq + 1, 0, 0, 0, 0.0f, k.data(), k.data()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(StreamAccess(*cache).insert(seq, 1, 0, 0, 0.0f, k.data(), k.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      StreamAccess(*cache).insert(seq, 0, 0, 0, std::nanf(""), k.data(), k.data()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamAccess(*cache).insert(seq, 0, 0, 0, 0.0f, nullptr, k.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(StreamAccess(*cache).insert(seq, 0, 0, 5, 0.0f, k.data(), k.data()).ok());
  EXPECT_EQ(StreamAccess(*cache).insert(seq, 0, 0, 5, 0.0f, k.data(), k.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 3, 0, -1e9f, 1.0f, 6), 0);
  EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq + 7, 0, 0, -1e9f, 1.0f, 6), 0);
  EXPECT_TRUE(cache->pages(seq, 0, 9).empty());
  EXPECT_EQ(cache->page(-1).pos, nullptr);
  EXPECT_EQ(cache->page(4).pos, nullptr);
  cache->release(seq + 100);  // unknown: ignored
  expect_consistent(*cache, {{seq, 6}});
}

TEST(Pool, BetaZeroNeverEvictsEvenInfiniteLevels) {
  const CacheShape shape{.n_layers = 1, .n_heads = 1, .head_dim = 2, .page_slots = 4};
  auto cache = testing::make_cache(shape, 4);
  const SeqId seq = *cache->add_sequence(fpa_policy(20.0f));
  const float inf = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(insert_key(*cache, seq, 0, 0, 0, inf).ok());
  EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 0, 0, -inf, 0.0f, 1), 0);
  EXPECT_EQ(StreamAccess(*cache).evict_for_chunk(seq, 0, 0, -inf, -1.0f, 4), 0);
  EXPECT_EQ(cache->sequence_stats(seq).live_keys, 1);
  EXPECT_EQ(StreamAccess(*cache).evict_for_step(seq, 0, 0, 0.0f, 1.0f, 5), 1);  // inf - 0 >= 20
}

TEST(Storage, SizesAndDeviceOnlyMode) {
  const CacheShape shape{.n_layers = 2, .n_heads = 4, .head_dim = 64, .page_slots = 16};
  auto host = testing::make_cache(shape, 10);
  EXPECT_EQ(host->stats().bytes_per_key, 2 * 64 * 4 + 16);
  EXPECT_EQ(host->stats().pages_total, 10);
  const int64_t page_bytes = 16 * (2 * 64 * 4 + 16);
  EXPECT_EQ(KvCache::pages_for_bytes(shape, 100 * page_bytes), 100);
  EXPECT_EQ(KvCache::pages_for_bytes(shape, page_bytes - 1), 0);
  EXPECT_EQ(KvCache::pages_for_bytes(CacheShape{}, 1 << 20), 0);

  auto device = testing::make_cache(shape, 10, /*host_storage=*/false);
  const SeqId seq = *device->add_sequence(fpa_policy(20.0f));
  const auto ref = StreamAccess(*device).insert(seq, 1, 3, 0, 2.5f, nullptr, nullptr);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const PageView v = device->page(ref->page);
  EXPECT_EQ(v.k, nullptr);
  EXPECT_EQ(v.v, nullptr);
  EXPECT_EQ(v.lvl[ref->slot], 2.5f);
  EXPECT_EQ(v.pos[ref->slot], 0);
  // A device pool keeps k, v, lvl, m and pos; the attention mass stays with the host.
  EXPECT_EQ(device->stats().bytes_held(), 16 * (2 * 64 * 4 + 12));
  EXPECT_EQ(device->stats().bytes_full(), 2 * 64 * 4 + 12);

  // Bytes follow the storage's dtype: a bf16 device pool holds half the k and v bytes.
  CacheShape bf16 = shape;
  bf16.kv_bytes = 2;
  EXPECT_EQ(KvCache::bytes_per_key(bf16, false), 2 * 64 * 2 + 12);
  EXPECT_EQ(KvCache::pages_for_bytes(bf16, 100 * 16 * (2 * 64 * 2 + 12), false), 100);
  auto half = KvCache::create(bf16, 10, /*host_storage=*/false);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ((*half)->stats().bytes_per_key, 2 * 64 * 2 + 12);
  auto host_half = KvCache::create(bf16, 10, /*host_storage=*/true);
  ASSERT_TRUE(host_half.ok()) << host_half.status();
  EXPECT_EQ((*host_half)->stats().bytes_per_key, 2 * 64 * 2 + 16);
}

// A device backend keeps k and v itself, addressed by (page, slot): following the SlotRefs that
// insert returns and the moves compact reports must keep its mirror equal to the cache.
TEST(Storage, DeviceMirrorFollowsInsertsAndMoves) {
  const CacheShape shape{.n_layers = 1, .n_heads = 2, .head_dim = 16, .page_slots = 4};
  auto cache = testing::make_cache(shape, 64, /*host_storage=*/false);
  const SeqId seq = *cache->add_sequence(fpa_policy(2.0f));
  std::map<std::pair<int32_t, int32_t>, int32_t> mirror;  // (page, slot) -> position
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float phi[2] = {0.0f, 0.0f};
  int moves = 0;
  for (int32_t pos = 0; pos < 300; ++pos) {
    for (int h = 0; h < 2; ++h) {
      phi[h] += normal(rng);
      StreamAccess(*cache).evict_for_step(seq, 0, h, phi[h], 1.0f, pos);
      const auto ref =
          StreamAccess(*cache).insert(seq, 0, h, pos, phi[h] + normal(rng), nullptr, nullptr);
      ASSERT_TRUE(ref.ok()) << ref.status();
      mirror[{ref->page, ref->slot}] = pos;
      StreamAccess(*cache).compact(seq, 0, h, [&](SlotRef from, SlotRef to) {
        mirror[{to.page, to.slot}] = mirror.at({from.page, from.slot});
        ++moves;
      });
      // Every live slot the cache reports holds the key the mirror put there.
      for (const auto& [p, key] : testing::live_keys(*cache, seq, 0, h)) {
        ASSERT_EQ((mirror[{key.ref.page, key.ref.slot}]), p);
      }
    }
  }
  EXPECT_GT(moves, 50);
  expect_consistent(*cache, {{seq, 2 * 300}});
}

TEST(Storage, HostPagesAreAlignedStructureOfArrays) {
  const CacheShape shape{.n_layers = 1, .n_heads = 1, .head_dim = 8, .page_slots = 16};
  auto cache = testing::make_cache(shape, 3);
  const SeqId seq = *cache->add_sequence(fpa_policy(20.0f));
  std::vector<float> k(8), v(8);
  for (int i = 0; i < 8; ++i) k[i] = float(i), v[i] = float(-i);
  const auto ref = StreamAccess(*cache).insert(seq, 0, 0, 0, 1.0f, k.data(), v.data(), 7.0f);
  ASSERT_TRUE(ref.ok());
  const PageView view = cache->page(ref->page);
  for (const void* p : {static_cast<const void*>(view.k), static_cast<const void*>(view.v),
                        static_cast<const void*>(view.lvl), static_cast<const void*>(view.m),
                        static_cast<const void*>(view.acc), static_cast<const void*>(view.pos)}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  }
  EXPECT_TRUE(std::equal(k.begin(), k.end(), view.k + ref->slot * 8));
  EXPECT_TRUE(std::equal(v.begin(), v.end(), view.v + ref->slot * 8));
  EXPECT_EQ(view.m[ref->slot], 7.0f);
  EXPECT_EQ(view.acc[ref->slot], 0.0f);
}

// bf16 host pages: k and v rounded to nearest even as they go in, half the bytes a key holds
// (lvl, m, acc and pos stay float32 / int32), and a fork copies them bit for bit.
TEST(Storage, Bf16HostPagesRoundAndHalveTheBytes) {
  const CacheShape f32{.n_layers = 1, .n_heads = 1, .head_dim = 8, .page_slots = 16};
  CacheShape bf16 = f32;
  bf16.kv_bytes = 2;
  EXPECT_EQ(KvCache::bytes_per_key(f32, true), 2 * 8 * 4 + 16);
  EXPECT_EQ(KvCache::bytes_per_key(bf16, true), 2 * 8 * 2 + 16);
  auto cache = testing::make_cache(bf16, 3);
  const SeqId seq = *cache->add_sequence(fpa_policy(20.0f));
  std::vector<float> k(8), v(8);
  for (int i = 0; i < 8; ++i) k[i] = 1.0f + 1.0f / 3.0f * float(i), v[i] = -k[i];
  const auto ref = StreamAccess(*cache).insert(seq, 0, 0, 0, 1.0f, k.data(), v.data());
  ASSERT_TRUE(ref.ok()) << ref.status();
  const PageView view = cache->page(ref->page);
  EXPECT_EQ(view.k, nullptr);
  ASSERT_NE(view.k16, nullptr);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(view.k16[ref->slot * 8 + i], round_to_bf16(k[i])) << i;
    EXPECT_EQ(view.v16[ref->slot * 8 + i], round_to_bf16(v[i])) << i;
    if (i % 3 != 0) {
      EXPECT_NE(bf16_to_float(view.k16[ref->slot * 8 + i]), k[i]) << "not rounded";
    }
  }
  EXPECT_EQ(cache->stats().bytes_held(), 16 * (2 * 8 * 2 + 16));
  const auto copy = cache->fork(seq);
  ASSERT_TRUE(copy.ok()) << copy.status();
  const auto pages = cache->pages(*copy, 0, 0);
  ASSERT_EQ(pages.size(), 1u);
  const PageView forked = cache->page(pages[0]);
  const int slot = std::find(forked.pos, forked.pos + 16, 0) - forked.pos;
  ASSERT_LT(slot, 16);
  EXPECT_TRUE(
      std::equal(forked.k16 + slot * 8, forked.k16 + slot * 8 + 8, view.k16 + ref->slot * 8));
  EXPECT_TRUE(
      std::equal(forked.v16 + slot * 8, forked.v16 + slot * 8 + 8, view.v16 + ref->slot * 8));
}

TEST(Storage, RejectsOtherElementSizes) {
  CacheShape shape{.n_layers = 1, .n_heads = 1, .head_dim = 8, .page_slots = 16};
  shape.kv_bytes = 3;
  const auto cache = KvCache::create(shape, 4);
  ASSERT_FALSE(cache.ok());
  EXPECT_NE(cache.status().message().find("kv_bytes"), std::string::npos) << cache.status();
}

TEST(Policies, ParseNameAndValidate) {
  for (Policy p : {Policy::kFpa, Policy::kNone, Policy::kWindow, Policy::kSinks, Policy::kH2O}) {
    EXPECT_EQ(*parse_policy(policy_name(p)), p);
  }
  const auto bad = parse_policy("lru");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("lru"), std::string_view::npos);

  auto cache = testing::make_cache({.n_layers = 1, .n_heads = 1, .head_dim = 2}, 2);
  auto rejected = [&](auto edit) {
    PolicyConfig p;
    edit(p);
    return cache->add_sequence(p).status().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.tau = 0.0f; }));
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.tau = std::nanf(""); }));
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.policy = Policy::kWindow, p.budget_fraction = 0; }));
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.policy = Policy::kH2O, p.budget_fraction = 2; }));
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.policy = Policy::kWindow, p.min_budget = 0; }));
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.policy = Policy::kSinks, p.sink_tokens = 8; }));
  EXPECT_TRUE(rejected([](PolicyConfig& p) { p.policy = Policy::kH2O, p.h2o_recent_share = 2; }));
  const auto snapkv = [](int window, int pool, int64_t prompt) {
    return [=](PolicyConfig& p) {
      p.policy = Policy::kSnapKV, p.snapkv_window = window, p.snapkv_pool = pool;
      p.prompt_tokens = prompt;
    };
  };
  EXPECT_TRUE(rejected(snapkv(0, 7, 10)));
  EXPECT_TRUE(rejected(snapkv(32, 4, 10)));
  EXPECT_TRUE(rejected(snapkv(32, 0, 10)));
  EXPECT_TRUE(rejected(snapkv(32, 7, 0)));
  for (auto [edit, field] : {std::pair{snapkv(0, 7, 10), "snapkv_window"},
                             {snapkv(32, 4, 10), "snapkv_pool"},
                             {snapkv(32, 7, 0), "prompt_tokens"}}) {
    PolicyConfig p;
    edit(p);
    EXPECT_NE(validate_policy(p).message().find(field), std::string_view::npos)
        << validate_policy(p);
  }
  PolicyConfig smallest;
  snapkv(1, 1, 1)(smallest);
  EXPECT_TRUE(validate_policy(smallest).ok());
  EXPECT_EQ(cache->stats().sequences, 0);
}

// Random traffic over several sequences and every policy on a tight pool: a runner's loop
// (pages_needed, then evict and insert), chunks, compaction, releases. The recount must equal the
// statistics after every operation, and everything returns to the pool at the end.
TEST(Pool, NoLeaksUnderRandomTraffic) {
  const CacheShape shape{.n_layers = 2, .n_heads = 2, .head_dim = 2, .page_slots = 4};
  auto cache = testing::make_cache(shape, 48);
  std::mt19937 rng(3);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Seq {
    int32_t next = 0;
    std::vector<float> phi = std::vector<float>(4, 0.0f);
    int64_t full = 0;  // sum over streams of last position + 1
    std::vector<int32_t> full_last = std::vector<int32_t>(4, -1);
  };
  std::map<SeqId, Seq> seqs;
  int64_t inserted = 0, evicted = 0, released = 0, exhausted = 0;
  auto full_keys = [&] {
    std::map<SeqId, int64_t> out;
    for (const auto& [id, s] : seqs) out[id] = s.full;
    return out;
  };
  auto step = [&](SeqId id, Seq& s, int n) {
    const bool fits = cache->pages_needed(id, n) <= cache->free_pages();
    for (int st = 0; st < 4; ++st) {
      const int l = st / 2, h = st % 2;
      std::vector<float> phi;
      for (int i = 0; i < n; ++i) phi.push_back(s.phi[st] += normal(rng));
      const float min_phi = *std::min_element(phi.begin(), phi.end());
      evicted += n == 1 ? StreamAccess(*cache).evict_for_step(id, l, h, phi[0], 0.5f, s.next)
                        : StreamAccess(*cache).evict_for_chunk(id, l, h, min_phi, 0.5f, s.next - 1);
      for (int i = 0; i < n; ++i) {
        const absl::Status ok = insert_key(*cache, id, l, h, s.next + i, phi[i] + normal(rng));
        if (ok.ok()) {
          ++inserted;
          s.full += int64_t{s.next + i} + 1 - (s.full_last[st] + 1);
          s.full_last[st] = s.next + i;
        } else {
          ASSERT_FALSE(fits) << "pages_needed promised room: " << ok;
          ASSERT_EQ(ok.code(), absl::StatusCode::kResourceExhausted);
          ++exhausted;
        }
      }
    }
    s.next += n;
  };
  for (int op = 0; op < 4000; ++op) {
    const int what = pick(20);
    if (seqs.size() < 2 || (what == 0 && seqs.size() < 6)) {
      PolicyConfig p;
      p.policy = static_cast<Policy>(pick(7));
      p.tau = 2.0f;
      p.budget_fraction = 0.3f;
      p.min_budget = 3;
      p.sink_tokens = 2;
      p.snapkv_window = 4;
      p.snapkv_pool = 3;
      p.prompt_tokens = 1 + pick(40);
      const auto id = cache->add_sequence(p);
      ASSERT_TRUE(id.ok()) << id.status();
      seqs[*id];
    } else if (what == 1) {
      auto it = std::next(seqs.begin(), pick(static_cast<int>(seqs.size())));
      released += cache->sequence_stats(it->first).live_keys;
      cache->release(it->first);
      seqs.erase(it);
    } else if (what == 2) {
      const SeqId id = std::next(seqs.begin(), pick(static_cast<int>(seqs.size())))->first;
      StreamAccess(*cache).compact(id, pick(2), pick(2), {});
    } else {
      auto it = std::next(seqs.begin(), pick(static_cast<int>(seqs.size())));
      step(it->first, it->second, what < 6 ? 1 + pick(8) : 1);
      if (HasFatalFailure()) return;
    }
    expect_consistent(*cache, full_keys());
    if (HasFailure()) return;
  }
  EXPECT_GT(exhausted, 0) << "the pool should run dry sometimes";
  EXPECT_EQ(cache->stats().evicted_slots, evicted);
  EXPECT_GT(evicted, 1000);
  const int64_t live = cache->stats().live_slots;
  for (const auto& [id, s] : seqs) cache->release(id);
  const CacheStats end = cache->stats();
  EXPECT_EQ(end.pages_in_use, 0);
  EXPECT_EQ(end.live_slots, 0);
  EXPECT_EQ(end.full_cache_keys, 0);
  EXPECT_EQ(end.sequences, 0);
  EXPECT_EQ(cache->free_pages(), 48);
  EXPECT_EQ(inserted, evicted + released + live);
}

}  // namespace
}  // namespace fpa::cache
