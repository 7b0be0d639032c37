// The cache's side of one layer of a step, in one call: the kernels computed the field and
// attended; the cache evicts, inserts and compacts, for every backend in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/statusor.h"
#include "cache/batch_item.h"
#include "cache/device_pool.h"
#include "cache/kv_cache.h"

namespace fpa::cache {

// What the kernels computed for the layer. Per-row, per-head values sit at
// [row * row_stride + head * head_stride]; a host-storage cache also takes the keys and values,
// head h of row r at [r * kv_stride + h * head_dim].
struct LayerRows {
  const float* phi = nullptr;  // the walk at each row
  const float* lvl = nullptr;  // each row's key level
  const float* acc = nullptr;  // mass each new key got within its step, as MassRule records it
  long row_stride = 0;
  long head_stride = 0;
  const float* k = nullptr;  // null for a device pool
  const float* v = nullptr;
  long kv_stride = 0;
};

// Threads to share a layer's edits: run(n, f) calls f(i) for every i in [0, n), up to `threads`
// at once, and returns when all have returned (a backend's thread pool).
struct Workers {
  int threads = 1;
  std::function<void(int n, const std::function<void(int)>& f)> run;
};

// For every (item, head) in step order: a decode token evicts at its phi, then its key goes in
// (m = +inf; under MassRule::kLast it goes in first and competes); a prompt chunk's keys go in with
// m = min of phi after them within the chunk (a key already dead by then is never cached), then the
// stream evicts for the chunk at its minimum phi. Each stream keeps its last phi. Streams that lost
// keys are compacted after every insert of the layer, so a page compaction frees is never handed to
// another stream before the writes above. Pages come from the sequences' reservations
// (KvCache::reserve); running out midway is an internal error.
// The layer's slot edits go to the cache's device (DevicePool::apply) when one is attached; a
// cache whose keys live on a device refuses the layer (FailedPrecondition, nothing changed)
// while none is. Returns how many cached keys it evicted (a key dead within its own chunk was
// never cached: it is not counted).
// The items' rows lie item after item from row 0 (one row for a decode token).
// With `workers` and no device attached, runs of whole items go to the workers' threads, each run
// compacting after its own inserts (the order above is for a device's copy of the pages); a
// sequence's edits stay on one thread, in step order.
absl::StatusOr<int64_t> apply_layer(KvCache& cache, int layer, std::span<const BatchItem> items,
                                    std::span<const float> beta, const LayerRows& rows,
                                    const Workers* workers = nullptr);

}  // namespace fpa::cache
