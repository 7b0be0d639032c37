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

  int evict_for_step(SeqId seq, int layer, int head, float phi, float beta, int32_t pos) {
    return e_.evict_for_step(seq, layer, head, phi, beta, pos);
  }
  int evict_for_chunk(SeqId seq, int layer, int head, float min_phi, float beta, int32_t end) {
    return e_.evict_for_chunk(seq, layer, head, min_phi, beta, end);
  }
  absl::StatusOr<SlotRef> insert(SeqId seq, int layer, int head, int32_t pos, float lvl,
                                 const float* k, const float* v,
                                 float m = std::numeric_limits<float>::infinity()) {
    return e_.insert(seq, layer, head, pos, lvl, k, v, m);
  }
  void set_last_phi(SeqId seq, int layer, int head, float phi) {
    e_.set_last_phi(seq, layer, head, phi);
  }
  void prefetch(SeqId seq, int layer, int head, int step) const {
    e_.prefetch(seq, layer, head, step);
  }
  int compact(SeqId seq, int layer, int head,
              const std::function<void(SlotRef from, SlotRef to)>& on_move = {}) {
    return e_.compact(seq, layer, head, on_move);
  }

 private:
  StreamEditor& e_;
};

}  // namespace fpa::cache
