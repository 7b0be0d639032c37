// The device's FoX Pro key / value shift rows (shift_slots.h): per sequence slot, every layer's
// last unshifted k and v projection rows, in one buffer that grows keeping its rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/shift_slots.h"

namespace fpa::cuda {

class ShiftRows {
 public:
  ShiftRows(int n_layers, int width) : n_layers_(n_layers), width_(width) {}

  // Before a step's launches (none of this may run inside a graph capture): the items' slots,
  // uploaded; the buffer grown to hold them; the slots of sequences at position 0 zeroed.
  absl::Status begin(std::span<const cache::BatchItem> items, const cache::KvCache& cache,
                     cudaStream_t stream);
  // After the step ran.
  void end(std::span<const cache::BatchItem> items) { slots_.end(items); }

  float* rows() const { return rows_.as<float>(); }  // [slots][n_layers][2][width]
  const int32_t* item_slot() const { return item_slot_.as<int32_t>(); }

 private:
  absl::Status grow(int capacity, cudaStream_t stream);
  size_t slot_floats() const { return static_cast<size_t>(n_layers_) * 2 * width_; }

  int n_layers_, width_;
  ShiftSlots slots_;
  ShiftSlots::Step step_;  // the step's slots, kept while their upload is in flight
  DeviceBuffer rows_, item_slot_;
  int capacity_ = 0;
};

}  // namespace fpa::cuda
