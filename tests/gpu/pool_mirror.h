// A host emulation of the CUDA backend's device page pool: it applies a LayerChanges with the
// kernels' semantics (resets, writes, moves in order) and the attention pass's m update and
// dead-key marking, so CPU-only tests check the bookkeeping contract the device relies on.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "cache/device_pool.h"
#include "kernels/cuda/step_plan.h"

namespace fpa::cuda {

class PoolMirror final : public cache::DevicePool {
 public:
  PoolMirror(int64_t pages, int page_slots);

  // What attention_kernel (one-token items) or commit_chunk_kernel (chunks) does to the cached
  // keys of one stream: m = min(m, chunk_min), free the keys with lvl - m >= thr. Returns how
  // many it freed (what the kernels count as retired).
  int attend(std::span<const int32_t> pre_step_pages, int32_t pos0, float chunk_min, float thr);
  // launch_pool_update.
  void apply(const cache::LayerChanges& update);
  // CudaBackend::copy_slots: what a fork sends the device.
  absl::Status copy_slots(std::span<const int32_t> reset_pages,
                          std::span<const cache::SlotCopy> copies) override;
  std::set<int32_t> live(std::span<const int32_t> pages) const;

 private:
  void reset(int32_t page);
  struct Slot {
    int32_t pos = -1;
    float lvl = 0.0f;
    float m = 0.0f;
  };
  int page_slots_;
  std::vector<Slot> slots_;
};

}  // namespace fpa::cuda
