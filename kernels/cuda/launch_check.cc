#include "kernels/cuda/launch_check.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_memory.h"

namespace fpa::cuda {
bool sync_launches() {
  static const bool sync = [] {
    const char* v = std::getenv("FPA_CUDA_SYNC");
    return v != nullptr && absl::string_view(v) == "1";
  }();
  return sync;
}

absl::Status checked(const char* what, cudaStream_t stream) {
  return sync_launches() ? cuda_status(cudaStreamSynchronize(stream), what) : absl::OkStatus();
}

// The kernel's name is spelled out only on failure: launches are a decode step's hot path.
absl::Status launched(const char* kernel, cudaStream_t stream) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && sync_launches()) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) return absl::OkStatus();
  return cuda_status(err, absl::StrCat("kernel ", kernel).c_str());
}

}  // namespace fpa::cuda
