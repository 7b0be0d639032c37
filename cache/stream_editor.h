// One stream's edits -- one (sequence, layer, head): evictions, inserts, the last field value,
// compaction. Private: the per-layer update (layer_update.cc, apply_layer) makes them after each
// layer's kernels, in one order for every backend, and StreamAccess (stream_access.h) is the one
// named door for what writes keys no kernel computed (tests, benchmarks, the CUDA backend's
// synthetic context). Nothing else edits a stream.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>

#include "absl/status/statusor.h"
#include "cache/device_pool.h"
#include "cache/kv_types.h"

namespace fpa::cache {

struct SequenceState;  // the cache's own record of a sequence

// A sequence looked up once (StreamEditor::resolve) for a run of edits, which then skip the
// lookup and the lock that guards it: a layer's update takes that lock once an item, not a few
// times a stream, where its threads would take turns at it. Valid until the sequence is released;
// `state` is null for an unknown sequence.
struct SeqRef {
  SequenceState* state = nullptr;
  SeqId id = -1;
};

class StreamEditor {
 public:
  virtual ~StreamEditor() = default;

 private:
  friend class LayerWriter;
  friend class StreamAccess;

  // The sequence, for the edits below (one lookup under the cache's lock).
  virtual SeqRef resolve(SeqId seq) const = 0;

  // Decode-step eviction for one stream, before the new key of position `pos` goes in:
  //  kFpa: frees every live key with lvl - phi >= tau / beta (beta <= 0: none);
  //  heuristics: frees keys so that, with the key at `pos` (inserted already or next), the
  //  stream holds its budget for length pos + 1. Returns how many keys were freed. Pages left
  //  empty are freed at once.
  virtual int evict_for_step(SeqRef seq, int layer, int head, float phi, float beta,
                             int32_t pos) = 0;
  // Prefill-chunk eviction for the chunk ending at chunk_end_pos, after the chunk's attention:
  // keys cached before the chunk die when lvl - min_phi_chunk >= tau / beta. The chunk's own keys
  // carry m = min of phi over (pos, chunk_end_pos] (insert's `m`) and die when
  // lvl - m >= tau / beta: in this call when inserted before it, else at the next eviction call.
  // Heuristics: free keys until the stream holds budget(chunk_end_pos + 1).
  virtual int evict_for_chunk(SeqRef seq, int layer, int head, float min_phi_chunk, float beta,
                              int32_t chunk_end_pos) = 0;
  // Takes a free slot of the stream (a new page when all are full) and records pos and lvl;
  // with host storage it also writes k, v (head_dim floats each), m = `m`, acc = 0.
  // ResourceExhausted when the pool is empty; the cache is unchanged then.
  virtual absl::StatusOr<SlotRef> insert(SeqRef seq, int layer, int head, int32_t pos, float lvl,
                                         const float* k, const float* v,
                                         float m = std::numeric_limits<float>::infinity()) = 0;
  // Carries what the edits of heads [first_head, first_head + heads) of `seq` at `layer` changed
  // in the pool's counters (live, evicted and full-cache keys; CacheStats) to them, as one change.
  // Each stream holds them until it takes or returns a page, or until this call: a run of edits
  // ends with it. Not while another thread edits those streams.
  virtual void settle(SeqRef seq, int layer, int first_head, int heads) = 0;
  // Counts keys that died before they were cached (within their own prompt chunk) as evicted.
  virtual void count_dropped(int64_t keys) = 0;
  virtual void set_last_phi(SeqRef seq, int layer, int head, float phi) = 0;
  // Merges sparse pages of a stream when that frees at least one page. Each moved slot is
  // reported to `on_move` (apply_layer sends it to the device). Returns pages freed.
  virtual int compact(SeqRef seq, int layer, int head,
                      const std::function<void(SlotRef from, SlotRef to)>& on_move = {}) = 0;
  // A hint, which changes nothing: starts fetching what the stream's next edits read, one step of
  // its state at a time, each readable once the one before it has arrived (0: the stream's own
  // record; 1: the lists it holds; 2: the slots and the open page those name). A layer's update
  // asks for the streams a few ahead of the one it edits, which otherwise waits on each load.
  virtual void prefetch(SeqRef seq, int layer, int head, int step) const = 0;
  // Where a layer's slot edits go: the attached device, or null when there is none and the host
  // holds the keys. FailedPrecondition when the keys live on a device and none is attached: an
  // edit then could not reach them, so none may be made.
  virtual absl::StatusOr<DevicePool*> edit_device() const = 0;
};

}  // namespace fpa::cache
