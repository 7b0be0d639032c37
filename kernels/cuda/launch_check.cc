#include "kernels/cuda/launch_check.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace fpa::cuda {
namespace {

absl::Status failed(absl::string_view what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

bool sync_launches() {
  static const bool sync = [] {
    const char* v = std::getenv("FPA_CUDA_SYNC");
    return v != nullptr && absl::string_view(v) == "1";
  }();
  return sync;
}

}  // namespace

absl::Status checked(absl::string_view what, cudaStream_t stream) {
  if (!sync_launches()) return absl::OkStatus();
  if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess) return failed(what, err);
  return absl::OkStatus();
}

// The kernel's name is spelled out only on failure: launches are a decode step's hot path.
absl::Status launched(const char* kernel, cudaStream_t stream) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && sync_launches()) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return failed(absl::StrCat("kernel ", kernel), err);
  return absl::OkStatus();
}

}  // namespace fpa::cuda
