// The paged KV cache with per-head eviction (docs/fpa.md sections 2 and 3).
//
// A fixed pool of pages. Each stream -- one (sequence, layer, head) -- owns a list of pages of
// `page_slots` slots; a slot holds one key of that head: k, v, level, running minimum m, the
// attention mass it has received (for the policies that rank by it) and its token position.
// The cache does the bookkeeping (which slot is live, who dies when); backends read and write
// slot contents through PageView (host storage) or mirror them in device memory by page id.
//
// Split by who uses it: the pool's sequences, reservations and statistics here (the KV manager's,
// cache/kv_manager.h, and the runner's solo runs); the kernels' read view (KvView, kv_view.h);
// the per-stream edits (StreamEditor, stream_editor.h), private to the per-layer update.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/device_pool.h"
#include "cache/kv_types.h"
#include "cache/kv_view.h"
#include "cache/stream_editor.h"

namespace fpa::cache {

class KvCache : public KvView, public StreamEditor {
 public:
  // num_pages pages of page_slots slots. host_storage=false keeps only the bookkeeping (a
  // device backend holds the data, indexed by the same page ids and slots): page() then has
  // k = v = nullptr, while lvl, m, acc and pos stay on the host.
  // Calls for different (layer, head) streams may run concurrently; calls on the same stream,
  // and add_sequence / release, must not overlap other calls on that sequence.
  static absl::StatusOr<std::unique_ptr<KvCache>> create(CacheShape shape, int64_t num_pages,
                                                         bool host_storage = true);
  // Pages that fit in `bytes` for this shape, counted at bytes_per_key.
  static int64_t pages_for_bytes(CacheShape shape, int64_t bytes, bool host_storage = true);
  // What one slot of this storage holds: k and v at shape.kv_bytes, lvl, m, pos, and acc when
  // the host stores the keys (a device pool keeps no attention mass).
  static int64_t bytes_per_key(const CacheShape& shape, bool host_storage);
  ~KvCache() override = default;

  virtual absl::StatusOr<SeqId> add_sequence(const PolicyConfig& policy) = 0;
  // A new sequence in the state `seq` is in now (its live keys copied, densely packed, with
  // their levels, minima and masses, its eviction order and last phi), so that either can go
  // on alone. ResourceExhausted, nothing changed, when the unreserved pool cannot hold the copy.
  // The copies go to the attached device (DevicePool::copy_slots); a pool without host storage
  // refuses the fork (FailedPrecondition) while none is: the copy would read another stream's
  // keys there.
  virtual absl::StatusOr<SeqId> fork(SeqId seq) = 0;
  // The device every slot edit is sent to (null: none): a step's resets, writes and moves
  // (apply_layer) and a fork's copies. A pool without host storage needs one before any edit;
  // with host storage an attached device mirrors the pool (tests). Not owned; it must outlive
  // the cache or be detached.
  virtual void attach_device(DevicePool* device) = 0;
  // Called after each fork with (source, copy), so that per-sequence state kept beside the cache
  // (the CPU backend's FoX Pro key/value shift rows) follows the copy: a prefix hit then resumes
  // it too. One listener (empty: none); its owner resets it before it goes.
  virtual void on_fork(std::function<void(SeqId from, SeqId to)> listener) = 0;
  // Pages a fork of `seq` would take.
  virtual int64_t pages_to_fork(SeqId seq) const = 0;
  // Returns every page of the sequence to the pool at once. Unknown ids are ignored.
  virtual void release(SeqId seq) = 0;
  virtual const PolicyConfig& policy(SeqId seq) const = 0;

  // Worst-case number of free pages appending n_tokens to `seq` could take (every stream
  // opening new pages).
  virtual int64_t pages_needed(SeqId seq, int n_tokens) const = 0;
  // The step planner's one call (as vLLM's allocate_slots): before a step, holds back the
  // worst-case pages appending n_tokens to `seq` may take, so that the step cannot run out
  // midway. False, with nothing changed, when the pool cannot promise them: the caller preempts
  // or defers. Calling it again for the same sequence tops its reservation up; its inserts draw
  // from it first, and unreserve (or release) returns what the step did not use.
  virtual bool reserve(SeqId seq, int n_tokens) = 0;
  virtual void unreserve(SeqId seq) = 0;
  // Pages neither in use nor reserved.
  virtual int64_t free_pages() const = 0;

  virtual CacheStats stats() const = 0;  // thread-safe
  virtual SequenceStats sequence_stats(SeqId seq) const = 0;
};

}  // namespace fpa::cache
