// Error checks after kernel launches and cuBLAS calls. A kernel runs after its launch returns,
// so a fault inside it is normally reported by whichever CUDA call comes next, under that call's
// name, and leaves the context unusable. With FPA_CUDA_SYNC=1 in the environment (read once)
// every check first waits for its stream, so the failing kernel is the one named.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace fpa::cuda {

// Whether FPA_CUDA_SYNC=1 asked for a wait after every launch (which rules out graph capture).
bool sync_launches();

// After a cuBLAS call that succeeded: with FPA_CUDA_SYNC=1, the result of its kernels.
absl::Status checked(const char* what, cudaStream_t stream);

// After `kernel`'s launch: the launch's error, and with FPA_CUDA_SYNC=1 the kernel's.
absl::Status launched(const char* kernel, cudaStream_t stream);

}  // namespace fpa::cuda
