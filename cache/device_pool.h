// The device side of the pool: where the cache sends every edit it makes to the slots of a pool
// whose keys live on an accelerator (KvCache::create with host_storage = false), and the one way
// such edits reach it. A step's edits (page resets, key writes, compaction moves) come layer by
// layer from apply_layer (layer_update.h) as the cache makes them; a fork's copies come from
// KvCache::fork. A device-resident cache refuses both while no device is attached: the device's
// pages would go on holding other streams' keys. The CUDA backend implements it; tests emulate it
// (tests/gpu/pool_mirror.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/pool_edits.h"

namespace fpa::cache {

// One layer's edits of a step, to be replayed in this order: clear every slot of reset_pages
// (pages the layer's streams took, which may hold another stream's stale keys), write the keys,
// then make the moves in order.
struct LayerEdits {
  std::vector<int32_t> reset_pages;
  std::vector<KeyWrite> writes;
  std::vector<SlotMove> moves;
};

class DevicePool {
 public:
  virtual ~DevicePool() = default;
  // Layer `layer`'s edits, sent once per layer, in layer order, while the step that made them
  // runs: a write's k and v are head `head` of row `row` of that layer's k and v rows, which the
  // device holds (the host never sees them). The device queues them, so that it can upload a
  // whole step's edits at once; they must land before those rows are overwritten and before the
  // next step reads the pool. Its own kernels retire the keys the cache evicts (they read lvl and
  // m anyway), so evictions are not sent.
  virtual void apply(int layer, const LayerEdits& edits) = 0;
  // A fork's copies (no step, no rows): marks every slot of `reset_pages` free (pages the copy
  // took), then copies each slot's k, v, lvl, m and pos from `from` to `to`; the sources stay as
  // they are. Done before the next step reads the pool.
  virtual absl::Status copy_slots(std::span<const int32_t> reset_pages,
                                  std::span<const SlotCopy> copies) = 0;
};

}  // namespace fpa::cache
