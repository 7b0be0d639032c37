// The pool's free-page list and the cache-wide counters, changed together under one lock and read
// without it: writers bump a sequence number around each change (a seqlock), a reader retries
// until it saw no change, so a snapshot is always one consistent state and never blocks decoding.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cache/kv_cache.h"

namespace fpa::cache {

struct LedgerDelta {
  int64_t live = 0;
  int64_t evicted = 0;
  int64_t full_keys = 0;
  int64_t sequences = 0;

  LedgerDelta& operator+=(const LedgerDelta& d) {
    live += d.live;
    evicted += d.evicted;
    full_keys += d.full_keys;
    sequences += d.sequences;
    return *this;
  }
  bool empty() const { return live == 0 && evicted == 0 && full_keys == 0 && sequences == 0; }
};

class PageLedger {
 public:
  // The pool's pages in `regions` consecutive regions of equal size (the cache makes one a layer).
  PageLedger(int64_t num_pages, int64_t bytes_per_key, int regions = 1);

  // A free page, counted in use together with `delta`: from `*reservation` when it holds one
  // (which it then decrements), else one nobody reserved; nullopt (nothing changed) when none.
  // Page `near` when it is free (a stream's next page right after its last one), else one of
  // `region`, else one of the region with the most free pages.
  std::optional<int32_t> take_page(const LedgerDelta& delta, int64_t* reservation = nullptr,
                                   int32_t near = -1, int region = 0);
  // The region `page` lies in.
  int region_of(int32_t page) const { return static_cast<int>(page / region_pages_); }
  // Tops `*reservation` up to `pages` when enough unreserved pages are free; false (nothing
  // changed) otherwise.
  bool reserve(int64_t* reservation, int64_t pages);
  // Returns `*reservation` to the unreserved pool and zeroes it.
  void unreserve(int64_t* reservation);
  // Returns `pages` to the pool and applies `delta`, as one change.
  void apply(const LedgerDelta& delta, std::span<const int32_t> pages = {});

  int64_t free_pages() const;  // free and not reserved
  CacheStats snapshot() const;

 private:
  void apply_locked(const LedgerDelta& delta, int64_t pages_delta);
  void push_free(int32_t page);
  int32_t pop_free(int32_t near, int region);

  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> free_;  // guarded by mu_; a list a region, taken from the back
  std::vector<int32_t> free_at_;  // guarded by mu_; page -> its index in its region's list, or -1
  int64_t free_count_ = 0;        // guarded by mu_; pages in the lists
  int64_t reserved_ = 0;          // guarded by mu_; <= free_count_
  const int64_t pages_total_;
  const int64_t region_pages_;  // pages a region (the last may have fewer)
  const int64_t bytes_per_key_;
  std::atomic<uint64_t> version_{0};  // odd while a change is in progress
  std::atomic<int64_t> pages_in_use_{0};
  std::atomic<int64_t> pages_reserved_{0};
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> evicted_{0};
  std::atomic<int64_t> full_keys_{0};
  std::atomic<int64_t> sequences_{0};
};

}  // namespace fpa::cache
