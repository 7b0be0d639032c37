// The device side of a pool whose keys and values live on an accelerator (KvCache::create with
// host_storage = false): what the cache itself edits outside a step must reach it. A step's own
// edits (page resets, key writes, compaction moves) come back to the backend as LayerChanges,
// which it replays beside the step's activations (the writes read the step's k and v rows); a
// fork's copies have no step, so the cache sends them here. The CUDA backend implements it;
// tests emulate it (tests/gpu/pool_mirror.h).
// TODO(issue 23): the step's LayerChanges through this interface too, one path for every edit.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "cache/pool_edits.h"

namespace fpa::cache {

class DevicePool {
 public:
  virtual ~DevicePool() = default;
  // Marks every slot of `reset_pages` free (pages a fork's copy took, which may hold another
  // stream's stale keys), then copies each slot's k, v, lvl, m and pos from `from` to `to`; the
  // sources stay as they are. Done before the next step reads the pool.
  virtual absl::Status copy_slots(std::span<const int32_t> reset_pages,
                                  std::span<const SlotCopy> copies) = 0;
};

}  // namespace fpa::cache
