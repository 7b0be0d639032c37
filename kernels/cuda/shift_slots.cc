#include "kernels/cuda/shift_slots.h"

#include <algorithm>
#include <functional>

#include "kernels/shift_rule.h"
#include "model/status_macros.h"

namespace fpa::cuda {

absl::StatusOr<ShiftSlots::Step> ShiftSlots::begin(std::span<const cache::BatchItem> items,
                                                   const cache::KvCache& cache) {
  absl::erase_if(seqs_, [&](const auto& entry) {
    if (cache.contains(entry.first)) return false;
    free_.push_back(entry.second.slot);
    return true;
  });
  // Lowest slot last, so that the buffer's low slots are the ones in use.
  std::sort(free_.begin(), free_.end(), std::greater<>());
  for (const cache::BatchItem& it : items) {
    const auto found = seqs_.find(it.seq);
    FPA_RETURN_IF_ERROR(check_shift_continues(
        it, found == seqs_.end() ? std::nullopt : std::optional(found->second.next_pos)));
  }
  Step step;
  for (const cache::BatchItem& it : items) {
    auto [entry, added] = seqs_.try_emplace(it.seq);
    if (added) entry->second.slot = take_slot();
    if (it.start_pos == 0) {
      entry->second.next_pos = 0;
      step.fresh.push_back(entry->second.slot);
    }
    step.item_slot.push_back(entry->second.slot);
  }
  step.capacity = capacity_;
  return step;
}

void ShiftSlots::end(std::span<const cache::BatchItem> items) {
  for (const cache::BatchItem& it : items) {
    seqs_[it.seq].next_pos = it.start_pos + static_cast<int32_t>(it.tokens.size());
  }
}

// Doubles the slots when none is free: the device buffer then grows as seldom as a vector.
int32_t ShiftSlots::take_slot() {
  if (free_.empty()) {
    const int grown = std::max(8, 2 * capacity_);
    for (int s = grown - 1; s >= capacity_; --s) free_.push_back(s);
    capacity_ = grown;
  }
  const int32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

}  // namespace fpa::cuda
