// A host emulation of the CUDA backend's device page pool, built only from what the cache sends
// through cache::DevicePool (resets, key writes, moves, fork copies, with the kernels' semantics)
// plus the attention pass's own m update and dead-key marking (attend), so CPU-only tests check
// the contract the device relies on. With a head_dim it also keeps k and v, which a write reads
// from the step's rows (set_rows), as the device reads its own.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "cache/device_pool.h"

namespace fpa::cuda {

class PoolMirror final : public cache::DevicePool {
 public:
  PoolMirror(int64_t pages, int page_slots, int head_dim = 0);

  // What attention_kernel (one-token items) or commit_chunk_kernel (chunks) does to the cached
  // keys of one stream: m = min(m, chunk_min), free the keys with lvl - m >= thr. Returns how
  // many it freed (what the kernels count as retired).
  int attend(std::span<const int32_t> pre_step_pages, int32_t pos0, float chunk_min, float thr);
  // The step's k and v rows the next writes read: head h of row r at [r * stride + h * head_dim].
  void set_rows(const float* k, const float* v, long stride);

  // cache::DevicePool, applied at once (the backend queues, then replays in the same order).
  void apply(int layer, const cache::LayerEdits& edits) override;
  absl::Status copy_slots(std::span<const int32_t> reset_pages,
                          std::span<const cache::SlotCopy> copies) override;

  // Everything the interface delivered, in order, for the tests that check what reached it.
  struct Received {
    std::vector<std::pair<int, cache::LayerEdits>> layers;  // (layer, edits) per apply
    std::vector<int32_t> fork_resets;
    std::vector<cache::SlotCopy> fork_copies;
  };
  const Received& received() const { return received_; }
  void forget_received() { received_ = {}; }

  struct Slot {
    int32_t pos = -1;  // -1: free
    float lvl = 0.0f;
    float m = 0.0f;
  };
  const Slot& slot(int32_t index) const { return slots_[static_cast<size_t>(index)]; }
  std::span<const float> k(int32_t index) const { return row(k_, index); }
  std::span<const float> v(int32_t index) const { return row(v_, index); }
  std::set<int32_t> live(std::span<const int32_t> pages) const;

 private:
  void reset(int32_t page);
  void copy(int32_t from, int32_t to);
  std::span<const float> row(const std::vector<float>& data, int32_t index) const;
  std::span<float> row(std::vector<float>& data, int32_t index);

  int page_slots_;
  size_t head_dim_;
  std::vector<Slot> slots_;
  std::vector<float> k_, v_;  // [slot][head_dim], empty without a head_dim
  const float* rows_k_ = nullptr;
  const float* rows_v_ = nullptr;
  long rows_stride_ = 0;
  Received received_;
};

}  // namespace fpa::cuda
