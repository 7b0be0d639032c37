#include "kernels/cuda/shift_rows.h"

#include <utility>

namespace fpa::cuda {

absl::Status ShiftRows::begin(std::span<const cache::BatchItem> items, const cache::KvCache& cache,
                              cudaStream_t stream) {
  absl::StatusOr<ShiftSlots::Step> step = slots_.begin(items, cache);
  if (!step.ok()) return step.status();
  step_ = *std::move(step);
  if (absl::Status s = grow(step_.capacity, stream); !s.ok()) return s;
  for (int32_t slot : step_.fresh) {
    if (absl::Status s = cuda_status(cudaMemsetAsync(rows() + slot * slot_floats(), 0,
                                                     slot_floats() * sizeof(float), stream),
                                     "shift rows reset");
        !s.ok()) {
      return s;
    }
  }
  return upload(item_slot_, step_.item_slot.data(), step_.item_slot.size(), stream);
}

// A new buffer with the old rows copied in: slots already in use keep their rows.
absl::Status ShiftRows::grow(int capacity, cudaStream_t stream) {
  if (capacity <= capacity_) return absl::OkStatus();
  DeviceBuffer bigger;
  if (absl::Status s = bigger.reserve(capacity * slot_floats() * sizeof(float)); !s.ok()) return s;
  if (capacity_ > 0) {
    if (absl::Status s = cuda_status(
            cudaMemcpyAsync(bigger.as<float>(), rows(), capacity_ * slot_floats() * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream),
            "shift rows copy");
        !s.ok()) {
      return s;
    }
  }
  // The old buffer is freed below while the copy may still read it: wait for the copy first.
  if (absl::Status s = cuda_status(cudaStreamSynchronize(stream), "shift rows copy"); !s.ok()) {
    return s;
  }
  rows_ = std::move(bigger);
  capacity_ = capacity;
  return absl::OkStatus();
}

}  // namespace fpa::cuda
