#include "tests/gpu/pool_mirror.h"

#include <algorithm>

namespace fpa::cuda {

PoolMirror::PoolMirror(int64_t pages, int page_slots)
    : page_slots_(page_slots), slots_(static_cast<size_t>(pages) * page_slots) {}

int PoolMirror::attend(std::span<const int32_t> pre_step_pages, int32_t pos0, float chunk_min,
                       float thr) {
  int retired = 0;
  for (int32_t page : pre_step_pages) {
    for (int s = 0; s < page_slots_; ++s) {
      Slot& slot = slots_[static_cast<size_t>(page) * page_slots_ + s];
      if (slot.pos < 0 || slot.pos >= pos0) continue;
      slot.m = std::min(slot.m, chunk_min);
      if (slot.lvl - slot.m >= thr) {
        slot.pos = -1;
        ++retired;
      }
    }
  }
  return retired;
}

void PoolMirror::reset(int32_t page) {
  for (int s = 0; s < page_slots_; ++s) slots_[static_cast<size_t>(page) * page_slots_ + s] = {};
}

void PoolMirror::apply(const cache::LayerChanges& update) {
  for (int32_t page : update.reset_pages) reset(page);
  for (const cache::KeyWrite& w : update.writes) slots_[w.slot_index] = {w.pos, w.lvl, w.m};
  for (const cache::SlotMove& mv : update.moves) {
    slots_[mv.to] = slots_[mv.from];
    slots_[mv.from].pos = -1;
  }
}

absl::Status PoolMirror::copy_slots(std::span<const int32_t> reset_pages,
                                    std::span<const cache::SlotCopy> copies) {
  for (int32_t page : reset_pages) reset(page);
  for (const cache::SlotCopy& c : copies) slots_[c.to] = slots_[c.from];
  return absl::OkStatus();
}

std::set<int32_t> PoolMirror::live(std::span<const int32_t> pages) const {
  std::set<int32_t> out;
  for (int32_t page : pages) {
    for (int s = 0; s < page_slots_; ++s) {
      const Slot& slot = slots_[static_cast<size_t>(page) * page_slots_ + s];
      if (slot.pos >= 0) out.insert(slot.pos);
    }
  }
  return out;
}

}  // namespace fpa::cuda
