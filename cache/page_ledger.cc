#include "cache/page_ledger.h"

namespace fpa::cache {

namespace {

// Pages of a fresh pool a stream can grow into without a jump: the decode attention reads a
// stream's pages in order, and read 19 GB/s over pages strewn across the pool where it reads
// 25-31 over consecutive ones (bench/attention_bench.cc).
constexpr int64_t kRun = 16;

}  // namespace

PageLedger::PageLedger(int64_t num_pages, int64_t bytes_per_key)
    : free_at_(static_cast<size_t>(num_pages), -1),
      pages_total_(num_pages),
      bytes_per_key_(bytes_per_key) {
  free_.reserve(static_cast<size_t>(num_pages));
  // A fresh pool hands out the first page of every run of kRun before any second page (0, 16,
  // 32, ..., then 1, 17, ...): a new stream starts a run, and take_page(near) lets the stream
  // grow into the pages after it. Pushed in reverse, as free_ is taken from the back.
  const int64_t runs = (num_pages + kRun - 1) / kRun;
  for (int64_t i = kRun * runs - 1; i >= 0; --i) {
    const int64_t p = i % runs * kRun + i / runs;
    if (p < num_pages) push_free(static_cast<int32_t>(p));
  }
}

void PageLedger::push_free(int32_t page) {
  free_at_[static_cast<size_t>(page)] = static_cast<int32_t>(free_.size());
  free_.push_back(page);
}

int32_t PageLedger::pop_free(int32_t near) {
  const bool hit = near >= 0 && near < pages_total_ && free_at_[static_cast<size_t>(near)] >= 0;
  const int32_t page = hit ? near : free_.back();
  const int32_t at = free_at_[static_cast<size_t>(page)];
  free_[static_cast<size_t>(at)] = free_.back();  // the last one fills the hole
  free_at_[static_cast<size_t>(free_.back())] = at;
  free_.pop_back();
  free_at_[static_cast<size_t>(page)] = -1;
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
                                             int32_t near) {
  std::lock_guard lock(mu_);
  if (reservation != nullptr && *reservation > 0) {
    --*reservation;
    --reserved_;
  } else if (static_cast<int64_t>(free_.size()) <= reserved_) {
    return std::nullopt;
  }
  const int32_t page = pop_free(near);
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
  if (static_cast<int64_t>(free_.size()) - reserved_ < more) return false;
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
  return static_cast<int64_t>(free_.size()) - reserved_;
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
