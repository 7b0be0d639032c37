// The named door to a stream's edits (StreamEditor) outside the per-layer update: for code that
// writes keys no kernel computed -- the cache's tests, its benchmarks, the CUDA backend's synthetic
// context. A step's edits go through apply_layer (layer_update.h), never through this.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>

#include "cache/stream_editor.h"

namespace fpa::cache {

class StreamAccess {
 public:
  explicit StreamAccess(StreamEditor& editor) : e_(editor) {}

  // Each edit settles its stream's counters (StreamEditor::settle): CacheStats are exact after
  // every call.
  int evict_for_step(SeqId seq, int layer, int head, float phi, float beta, int32_t pos) {
    const SeqRef ref = e_.resolve(seq);
    const int n = e_.evict_for_step(ref, layer, head, phi, beta, pos);
    e_.settle(ref, layer, head, 1);
    return n;
  }
  int evict_for_chunk(SeqId seq, int layer, int head, float min_phi, float beta, int32_t end) {
    const SeqRef ref = e_.resolve(seq);
    const int n = e_.evict_for_chunk(ref, layer, head, min_phi, beta, end);
    e_.settle(ref, layer, head, 1);
    return n;
  }
  absl::StatusOr<SlotRef> insert(SeqId seq, int layer, int head, int32_t pos, float lvl,
                                 const float* k, const float* v,
                                 float m = std::numeric_limits<float>::infinity()) {
    const SeqRef ref = e_.resolve(seq);
    absl::StatusOr<SlotRef> slot = e_.insert(ref, layer, head, pos, lvl, k, v, m);
    e_.settle(ref, layer, head, 1);
    return slot;
  }
  void set_last_phi(SeqId seq, int layer, int head, float phi) {
    e_.set_last_phi(e_.resolve(seq), layer, head, phi);
  }
  void prefetch(SeqId seq, int layer, int head, int step) const {
    e_.prefetch(e_.resolve(seq), layer, head, step);
  }
  int compact(SeqId seq, int layer, int head,
              const std::function<void(SlotRef from, SlotRef to)>& on_move = {}) {
    return e_.compact(e_.resolve(seq), layer, head, on_move);
  }

 private:
  StreamEditor& e_;
};

}  // namespace fpa::cache
