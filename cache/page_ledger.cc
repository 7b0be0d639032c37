#include "cache/page_ledger.h"

#include <algorithm>

namespace fpa::cache {

namespace {

// Pages of a fresh pool a stream can grow into without a jump: the decode attention reads a
// stream's pages in order, and read 19 GB/s over pages strewn across the pool where it reads
// 25-31 over consecutive ones (bench/attention_bench.cc).
constexpr int64_t kRun = 16;

}  // namespace

// A layer's pages in a region of the pool of their own: a decode step's attention call for one
// layer read the same pages 13-16% slower strewn over the whole pool than gathered in one region,
// and with a region a layer its median fell 6% (bench/RESULTS.md, 2026-12-06, third session).
PageLedger::PageLedger(int64_t num_pages, int64_t bytes_per_key, int regions)
    : free_(static_cast<size_t>(std::max(regions, 1))),
      free_at_(static_cast<size_t>(num_pages), -1),
      pages_total_(num_pages),
      region_pages_(std::max<int64_t>(1, (num_pages + std::ssize(free_) - 1) / std::ssize(free_))),
      bytes_per_key_(bytes_per_key) {
  // A fresh region hands out the first page of every run of kRun before any second page (0, 16,
  // 32, ..., then 1, 17, ...): a new stream starts a run, and take_page(near) lets the stream
  // grow into the pages after it. Pushed in reverse, as a list is taken from the back.
  for (int64_t first = 0; first < num_pages; first += region_pages_) {
    const int64_t size = std::min(region_pages_, num_pages - first);
    const int64_t runs = (size + kRun - 1) / kRun;
    for (int64_t i = kRun * runs - 1; i >= 0; --i) {
      const int64_t p = i % runs * kRun + i / runs;
      if (p < size) push_free(static_cast<int32_t>(first + p));
    }
  }
}

void PageLedger::push_free(int32_t page) {
  std::vector<int32_t>& list = free_[static_cast<size_t>(region_of(page))];
  free_at_[static_cast<size_t>(page)] = static_cast<int32_t>(list.size());
  list.push_back(page);
  ++free_count_;
}

int32_t PageLedger::pop_free(int32_t near, int region) {
  int32_t page = near;
  if (near < 0 || near >= pages_total_ || free_at_[static_cast<size_t>(near)] < 0) {
    auto from = free_.begin() + std::clamp<int64_t>(region, 0, std::ssize(free_) - 1);
    if (from->empty()) {
      from = std::max_element(free_.begin(), free_.end(),
                              [](const auto& a, const auto& b) { return a.size() < b.size(); });
    }
    page = from->back();
  }
  std::vector<int32_t>& list = free_[static_cast<size_t>(region_of(page))];
  const int32_t at = free_at_[static_cast<size_t>(page)];
  list[static_cast<size_t>(at)] = list.back();  // the last one fills the hole
  free_at_[static_cast<size_t>(list.back())] = at;
  list.pop_back();
  free_at_[static_cast<size_t>(page)] = -1;
  --free_count_;
  return page;
}

void PageLedger::apply_locked(const LedgerDelta& delta, int64_t pages_delta) {
  version_.fetch_add(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  constexpr auto kRelaxed = std::memory_order_relaxed;
  if (pages_delta != 0) pages_in_use_.fetch_add(pages_delta, kRelaxed);
  if (delta.live != 0) live_.fetch_add(delta.live, kRelaxed);
  if (delta.evicted != 0) evicted_.fetch_add(delta.evicted, kRelaxed);
  if (delta.full_keys != 0) full_keys_.fetch_add(delta.full_keys, kRelaxed);
  if (delta.sequences != 0) sequences_.fetch_add(delta.sequences, kRelaxed);
  pages_reserved_.store(reserved_, kRelaxed);  // inside the bump, as every counter
  version_.fetch_add(1, std::memory_order_release);
}

std::optional<int32_t> PageLedger::take_page(const LedgerDelta& delta, int64_t* reservation,
                                             int32_t near, int region) {
  std::lock_guard lock(mu_);
  if (reservation != nullptr && *reservation > 0) {
    --*reservation;
    --reserved_;
  } else if (free_count_ <= reserved_) {
    return std::nullopt;
  }
  const int32_t page = pop_free(near, region);
  apply_locked(delta, 1);
  return page;
}

void PageLedger::apply(const LedgerDelta& delta, std::span<const int32_t> pages) {
  std::lock_guard lock(mu_);
  for (int32_t p : pages) push_free(p);
  apply_locked(delta, -static_cast<int64_t>(pages.size()));
}

bool PageLedger::reserve(int64_t* reservation, int64_t pages) {
  std::lock_guard lock(mu_);
  const int64_t more = pages - *reservation;
  if (more <= 0) return true;
  if (free_count_ - reserved_ < more) return false;
  reserved_ += more;
  *reservation = pages;
  apply_locked({}, 0);
  return true;
}

void PageLedger::unreserve(int64_t* reservation) {
  std::lock_guard lock(mu_);
  reserved_ -= *reservation;
  *reservation = 0;
  apply_locked({}, 0);
}

int64_t PageLedger::free_pages() const {
  std::lock_guard lock(mu_);
  return free_count_ - reserved_;
}

CacheStats PageLedger::snapshot() const {
  CacheStats s;
  s.pages_total = pages_total_;
  s.bytes_per_key = bytes_per_key_;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  while (true) {
    const uint64_t before = version_.load(std::memory_order_acquire);
    if (before % 2 == 1) continue;
    s.pages_in_use = pages_in_use_.load(kRelaxed);
    s.pages_reserved = pages_reserved_.load(kRelaxed);
    s.live_slots = live_.load(kRelaxed);
    s.evicted_slots = evicted_.load(kRelaxed);
    s.full_cache_keys = full_keys_.load(kRelaxed);
    s.sequences = sequences_.load(kRelaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (version_.load(kRelaxed) == before) return s;
  }
}

}  // namespace fpa::cache
