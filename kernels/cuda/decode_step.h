// Host side of a decode step that the device runs through every layer without waiting on the
// host (free of CUDA, so CPU-only builds test it). Before the step, everything the kernels of all
// layers read is gathered at once; the attention kernels retire the keys their threshold kills
// (they read lvl and m anyway) and count them; after the step, the cache applies its own rule to
// every layer in order (cache::apply_layer, as for every backend), checks that it evicted exactly
// what the device retired, and sends the device the page edits it replays before the next step.
//
// Deferring the cache's update to the end of the step changes nothing the device attends over:
// a layer's attention reads only that layer's streams, whose pages no other layer's update
// touches within the step, and every update lands (in layer order) before the next step reads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "cache/layer_update.h"
#include "kernels/backend.h"
#include "kernels/cuda/step_plan.h"

namespace fpa::cuda {

// Whether every item is one token (a decode step): only those run without the host; a prompt
// chunk's keys are cached per layer as before (its key writes would need every layer's rows).
bool decode_only(std::span<const cache::BatchItem> items);

// What the kernels of the step's layers read, gathered before they run. Per-stream values are
// layer-major: stream (layer block b, item i, head h) is at (b * items + i) * heads + h.
struct KernelInputs {
  std::vector<float> phi_prev;  // the field's last value per stream
  std::vector<float> thr;       // the threshold the kernels exclude keys at
  PageTables tables;            // every layer's page lists, offsets into one ids array
  std::vector<int> max_count;   // per layer block: its longest page list
};
// Appends the block of layer `layer`, whose heads' penalty scales are `beta`.
void append_kernel_inputs(std::span<const cache::BatchItem> items, int layer,
                          std::span<const float> beta, const cache::KvView& cache,
                          KernelInputs& in);
// Every layer's block, `betas[l]` being layer l's.
KernelInputs kernel_inputs(std::span<const cache::BatchItem> items,
                           std::span<const std::span<const float>> betas,
                           const cache::KvView& cache);

// The field rows the device computed: [layers][rows][heads] blocks.
struct DecodeField {
  const float* phi = nullptr;
  const float* lvl = nullptr;
};

// After the step: the cache's update of each layer in order, from the device's field rows; each
// layer's slot edits go to the cache's device as the cache makes them (cache::DevicePool::apply).
// Internal when a layer's evictions differ from the keys the device retired in it (`retired[l]`):
// host and device would then disagree about what is live, so the step must not go on.
absl::Status settle_decode(cache::KvCache& cache, std::span<const cache::BatchItem> items,
                           const BatchLayout& layout, std::span<const std::span<const float>> betas,
                           const DecodeField& field, std::span<const int32_t> retired);

}  // namespace fpa::cuda
