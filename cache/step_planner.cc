#include "cache/step_planner.h"

#include <algorithm>
#include <optional>

namespace fpa::cache {
namespace {

// plan_step's working state: the free pages as its decisions so far would leave them.
class Planner {
 public:
  Planner(const PoolState& pool, std::span<const PlanEntry> entries)
      : pool_(pool), entries_(entries), at_(entries.size()), free_(pool.free_pages) {}

  StepPlan run(int64_t prefill_budget);

 private:
  void reserve_all(int64_t prefill_budget);
  enum class State { kWaiting, kPlanned, kPreempted, kFailed };
  struct At {
    State state = State::kWaiting;
    int64_t tokens = 0;  // planned
    int64_t pages = 0;   // reserved for them
  };

  bool live(size_t i) const {
    return at_[i].state == State::kWaiting || at_[i].state == State::kPlanned;
  }
  int64_t reserve(size_t i, int64_t n);
  bool take(size_t i, int64_t n);
  int64_t largest_fit(size_t i, int64_t n) const;
  std::optional<size_t> choose_victim(size_t i) const;
  void preempt(size_t victim);

  const PoolState& pool_;
  std::span<const PlanEntry> entries_;
  std::vector<At> at_;
  int64_t free_;
  int64_t prefill_tokens_ = 0;
  bool waive_cap_ = false;  // kMaxPreemptions yields: the step would stand still otherwise
  StepPlan plan_;
};

StepPlan Planner::run(int64_t prefill_budget) {
  reserve_all(prefill_budget);
  // Nothing planned while requests wait: those that could give way have all done so
  // kMaxPreemptions times. One of them gives way once more rather than every request waiting on
  // the others for good.
  const auto planned = [&](const At& a) { return a.state == State::kPlanned; };
  const auto waiting = [&](const At& a) { return a.state == State::kWaiting; };
  if (std::ranges::none_of(at_, planned) && std::ranges::any_of(at_, waiting)) {
    waive_cap_ = true;
    reserve_all(prefill_budget);
  }
  for (const bool prefills : {false, true}) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (at_[i].state == State::kPlanned && entries_[i].prefilling == prefills) {
        plan_.items.push_back({i, at_[i].tokens});
      }
    }
  }
  return std::move(plan_);
}

void Planner::reserve_all(int64_t prefill_budget) {
  for (const bool prefills : {false, true}) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (at_[i].state != State::kWaiting || entries_[i].prefilling != prefills) continue;
      const int64_t n = entries_[i].tokens;
      if (prefills && prefill_tokens_ > 0 && prefill_tokens_ + n > prefill_budget) continue;
      if (const int64_t got = reserve(i, n); prefills) prefill_tokens_ += got;
    }
  }
}

// Plans i's next `n` tokens. When they do not fit: cached prefixes go first; then a prompt
// chunk shrinks to what fits; then a victim gives way and i tries again. Returns the tokens
// planned: 0 when i waits, gave way itself, or failed for not fitting the pool even alone.
int64_t Planner::reserve(size_t i, int64_t n) {
  for (;;) {
    if (take(i, n)) return n;
    if (plan_.snapshots_reclaimed < pool_.snapshot_pages.size()) {
      free_ += pool_.snapshot_pages[plan_.snapshots_reclaimed++];
      continue;
    }
    if (const int64_t fit = largest_fit(i, n); fit > 0 && take(i, fit)) return fit;
    bool others = false;
    for (size_t j = 0; j < entries_.size(); ++j) others = others || (j != i && live(j));
    if (!others) {
      at_[i].state = State::kFailed;
      plan_.failed.push_back(i);
      return 0;
    }
    const std::optional<size_t> victim = choose_victim(i);
    if (!victim) return 0;  // i waits with its pages for the others
    preempt(*victim);
    if (*victim == i) return 0;
  }
}

bool Planner::take(size_t i, int64_t n) {
  const int64_t pages = entries_[i].pages_needed(n);
  if (pages > free_) return false;
  free_ -= pages;
  at_[i] = {State::kPlanned, n, pages};
  return true;
}

// The most tokens under `n` of i's prompt chunk whose worst case fits the free pages (0: none).
int64_t Planner::largest_fit(size_t i, int64_t n) const {
  if (!entries_[i].prefilling) return 0;
  int64_t lo = 0, hi = n - 1;  // pages_needed grows with the tokens: bisect
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (entries_[i].pages_needed(mid) <= free_) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Who gives way when i does not fit beside the others: the newest of those admitted after it
// that were preempted least, else i itself, else the newest request of any age; never one already
// preempted kMaxPreemptions times (unless waive_cap_), so no request pays for the shortage again
// and again. A prompt chunk preempts only younger prompt chunks, never itself. None: i waits.
std::optional<size_t> Planner::choose_victim(size_t i) const {
  const bool prefill = entries_[i].prefilling;
  const auto may_preempt = [&](size_t j) {
    return waive_cap_ || entries_[j].preemptions < kMaxPreemptions;
  };
  std::optional<size_t> younger, any;
  for (size_t j = 0; j < entries_.size(); ++j) {
    if (j == i || !live(j) || (prefill && !entries_[j].prefilling)) continue;
    if (j > i && (!younger || entries_[j].preemptions <= entries_[*younger].preemptions)) {
      younger = j;
    }
    if (may_preempt(j)) any = j;
  }
  if (younger && may_preempt(*younger)) return younger;
  if (prefill) return std::nullopt;
  if (may_preempt(i)) return i;
  return any;
}

// Its pages go back to the pool, and what it had planned this step with them.
void Planner::preempt(size_t victim) {
  At& v = at_[victim];
  if (v.state == State::kPlanned && entries_[victim].prefilling) prefill_tokens_ -= v.tokens;
  free_ += entries_[victim].held_pages + (v.state == State::kPlanned ? v.pages : 0);
  v = {State::kPreempted, 0, 0};
  plan_.preempted.push_back(victim);
}

}  // namespace

StepPlan plan_step(const PoolState& pool, std::span<const PlanEntry> entries,
                   int64_t prefill_budget) {
  return Planner(pool, entries).run(prefill_budget);
}

bool admits(const Admission& a) {
  const int64_t own = std::max(a.ahead_pages, a.high_water_pages + a.streams);
  return own + a.running_ahead + a.watermark <= a.free_pages + a.reclaimable_pages;
}

int64_t next_step_tokens(int64_t prompt, int64_t target, int64_t cached, int64_t chunk,
                         bool chunks_replay_decode) {
  if (cached >= target) return 1;
  const int64_t end = chunks_replay_decode ? target : std::max(prompt, cached + 1);
  return std::min(end - cached, chunk - cached % chunk);
}

}  // namespace fpa::cache
