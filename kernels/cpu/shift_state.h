// FoX Pro's key / value shift (ShiftLinear in the published code) on the CPU: row t of a
// projection y' becomes a_t y'_{t-1} + (1 - a_t) y'_t per head, a = sigmoid(shift x), so each
// sequence carries its last y' row per layer from one forward (prompt chunk, decode step) to the
// next. A sequence that starts over (position 0, as after a preemption) starts from zeros; a fork
// (a prefix-cache snapshot or hit) takes a copy of its source's rows (copy); one that starts
// elsewhere without them is an error (kernels/shift_rule.h, the CUDA backend's rule too).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cache/kv_view.h"
#include "kernels/backend.h"

namespace fpa::cpu {

class ShiftStates {
 public:
  // Each sequence holds n_layers * 2 (key, value) rows of `width` floats.
  ShiftStates(int n_layers, int width) : n_layers_(n_layers), width_(width) {}

  // Before a forward: every item's state, fresh at position 0; states of sequences the cache no
  // longer holds are dropped.
  absl::Status begin(std::span<const cache::BatchItem> items, const cache::KvView& cache);
  // After it: where each item's sequence continues.
  void end(std::span<const cache::BatchItem> items);
  // `to` is a fork of `from`: it goes on from the same rows.
  void copy(cache::SeqId from, cache::SeqId to);

  // Shifts rows [0, len) of y [len, width] in place with gates a [len, n_heads] (pre-sigmoid),
  // continuing from, and then updating, the sequence's row for (layer, which: 0 key, 1 value).
  void apply(cache::SeqId seq, int layer, int which, const float* a, int n_heads, float* y,
             int len);

 private:
  struct State {
    int32_t next_pos = 0;
    std::vector<float> rows;  // [n_layers][2][width]
  };
  int n_layers_, width_;
  absl::flat_hash_map<cache::SeqId, State> states_;
};

}  // namespace fpa::cpu
