#include "kernels/cuda/gemm.h"

#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/launch_check.h"

namespace fpa::cuda {

absl::Status Gemm::init(cudaStream_t stream) {
  if (absl::Status s = cublas_status(cublasCreate(&handle_), "cublasCreate"); !s.ok()) return s;
  stream_ = stream;
  if (absl::Status s = cublas_status(cublasSetStream(handle_, stream), "cublasSetStream");
      !s.ok()) {
    return s;
  }
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper
  if (absl::Status s = workspace_.reserve(kWorkspaceBytes); !s.ok()) return s;
  return cublas_status(cublasSetWorkspace(handle_, workspace_.as<void>(), kWorkspaceBytes),
                       "cublasSetWorkspace");
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(handle_);
}

absl::Status Gemm::linear(const DeviceMatrix& w, const float* x, int n, float* y, bool accumulate) {
  if (n == 0) return absl::OkStatus();
  const void* b = x;
  cudaDataType type = CUDA_R_32F;
  if (w.bf16) {
    const int64_t count = static_cast<int64_t>(n) * w.cols;
    if (absl::Status s = x_bf16_.reserve(count * 2); !s.ok()) return s;
    if (absl::Status s = launch_to_bf16(x, count, x_bf16_.as<void>(), stream_); !s.ok()) return s;
    b = x_bf16_.as<void>();
    type = CUDA_R_16BF;
  }
  // Row-major W[out][in] is column-major W^T with ld = in; op T gives W. x and y likewise.
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (absl::Status s =
          cublas_status(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &alpha,
                                     w.data, type, w.cols, b, type, w.cols, &beta, y, CUDA_R_32F,
                                     w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
      !s.ok()) {
    return s;
  }
  return checked("cublasGemmEx", stream_);
}

}  // namespace fpa::cuda
