#include "tests/gpu/pool_mirror.h"

#include <algorithm>

namespace fpa::cuda {

PoolMirror::PoolMirror(int64_t pages, int page_slots, int head_dim)
    : page_slots_(page_slots),
      head_dim_(static_cast<size_t>(head_dim)),
      slots_(static_cast<size_t>(pages) * page_slots),
      k_(slots_.size() * head_dim_),
      v_(slots_.size() * head_dim_) {}

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

void PoolMirror::set_rows(const float* k, const float* v, long stride) {
  rows_k_ = k;
  rows_v_ = v;
  rows_stride_ = stride;
}

std::span<const float> PoolMirror::row(const std::vector<float>& data, int32_t index) const {
  return std::span(data).subspan(static_cast<size_t>(index) * head_dim_, head_dim_);
}

std::span<float> PoolMirror::row(std::vector<float>& data, int32_t index) {
  return std::span(data).subspan(static_cast<size_t>(index) * head_dim_, head_dim_);
}

void PoolMirror::reset(int32_t page) {
  for (int s = 0; s < page_slots_; ++s) slots_[static_cast<size_t>(page) * page_slots_ + s] = {};
}

void PoolMirror::copy(int32_t from, int32_t to) {
  slots_[static_cast<size_t>(to)] = slots_[static_cast<size_t>(from)];
  std::ranges::copy(row(k_, from), row(k_, to).begin());
  std::ranges::copy(row(v_, from), row(v_, to).begin());
}

// launch_pool_update: resets, writes (k and v from the step's rows), moves in order.
void PoolMirror::apply(int layer, const cache::LayerEdits& edits) {
  received_.layers.emplace_back(layer, edits);
  for (int32_t page : edits.reset_pages) reset(page);
  for (const cache::KeyWrite& w : edits.writes) {
    slots_[static_cast<size_t>(w.slot_index)] = {w.pos, w.lvl, w.m};
    if (head_dim_ == 0) continue;
    const long at = w.row * rows_stride_ + static_cast<long>(w.head) * static_cast<long>(head_dim_);
    std::copy_n(rows_k_ + at, head_dim_, row(k_, w.slot_index).begin());
    std::copy_n(rows_v_ + at, head_dim_, row(v_, w.slot_index).begin());
  }
  for (const cache::SlotMove& mv : edits.moves) {
    copy(mv.from, mv.to);
    slots_[static_cast<size_t>(mv.from)].pos = -1;
  }
}

// launch_slot_copies.
absl::Status PoolMirror::copy_slots(std::span<const int32_t> reset_pages,
                                    std::span<const cache::SlotCopy> copies) {
  received_.fork_resets.insert(received_.fork_resets.end(), reset_pages.begin(), reset_pages.end());
  received_.fork_copies.insert(received_.fork_copies.end(), copies.begin(), copies.end());
  for (int32_t page : reset_pages) reset(page);
  for (const cache::SlotCopy& c : copies) copy(c.from, c.to);
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
