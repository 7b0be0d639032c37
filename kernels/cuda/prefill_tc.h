// Prompt-chunk attention on tensor cores (prefill_tc.cu); launch_attention uses it for the
// chunks of a batch whose pool it fits.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/device_kernels.h"

namespace fpa::cuda {

// bf16 keys and values, head_dim a multiple of 16 up to 128.
bool prefill_tc_fits(const PoolView& pool);

// The rows of args.tc_tiles, every head: output rows written straight to args.out.
absl::Status launch_prefill_tc(const AttentionArgs& args, const PoolView& pool,
                               cudaStream_t stream);

}  // namespace fpa::cuda
