// FoX Pro's key / value shift on the CUDA backend, host side (free of CUDA, so CPU-only builds
// test it): row t of k (v) mixes in row t - 1 of the projection (kernels/cpu/shift_state.h), so a
// sequence carries its last projection row of every layer from one forward (prompt chunk, decode
// step) to the next. The device keeps those rows in slots of one buffer; this class says which
// slot is whose. Its rule is the CPU backend's (kernels/shift_rule.h): a sequence at position 0
// (new, or recomputed from the start after a preemption) starts from zero rows; one that
// continues must start where its last forward ended; one that starts elsewhere without rows (a
// fork, a prefix-cache hit) is refused.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"

namespace fpa::cuda {

class ShiftSlots {
 public:
  struct Step {
    std::vector<int32_t> item_slot;  // [items]: the slot each item reads and then updates
    std::vector<int32_t> fresh;      // slots the step must zero before it runs (position 0)
    int capacity = 0;                // slots the device buffer must hold; never shrinks
  };

  // Before a forward: frees the slots of sequences the cache no longer holds, then gives every
  // item its slot. FailedPrecondition, changing no slot, for an item that cannot continue.
  absl::StatusOr<Step> begin(std::span<const cache::BatchItem> items, const cache::KvCache& cache);
  // After a forward that ran: where each item's sequence continues.
  void end(std::span<const cache::BatchItem> items);

  int sequences() const { return static_cast<int>(seqs_.size()); }

 private:
  struct Entry {
    int32_t slot = 0;
    int32_t next_pos = 0;
  };
  int32_t take_slot();

  absl::flat_hash_map<cache::SeqId, Entry> seqs_;
  std::vector<int32_t> free_;  // the lowest slot last
  int capacity_ = 0;
};

}  // namespace fpa::cuda
