// Built when nvcc is absent: the CUDA backend reports itself unavailable, so callers link and
// fall back to the CPU backend.
#include "kernels/cuda/cuda_backend.h"

namespace fpa {

bool cuda_device_available() { return false; }

absl::StatusOr<std::unique_ptr<CudaBackend>> create_cuda_backend(const Model&, cache::KvCache&,
                                                                 const CudaOptions&) {
  return absl::UnavailableError("fpa-serve was built without CUDA");
}

absl::StatusOr<std::unique_ptr<Backend>> make_cuda_backend(const Model&, cache::KvCache&) {
  return absl::UnavailableError("fpa-serve was built without CUDA");
}

}  // namespace fpa
