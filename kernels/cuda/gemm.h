// Linear layers through cuBLAS: y[n][out] (+)= W[out][in] x[n][in], weights in bf16 or float32,
// float32 activations in and out, float32 accumulation.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/device_memory.h"

namespace fpa::cuda {

struct DeviceMatrix {
  const void* data = nullptr;
  int rows = 0;  // out
  int cols = 0;  // in
  bool bf16 = false;
};

class Gemm {
 public:
  Gemm() = default;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm();

  // The handle on `stream`, with a workspace of its own: cuBLAS then allocates nothing while a
  // step is captured into a graph (step_graph.h).
  absl::Status init(cudaStream_t stream);
  // Makes room for a bf16 copy of `elements` activations, so that no linear() of a captured
  // step has to allocate (nothing may be allocated during a capture).
  absl::Status reserve_input(size_t elements) { return x_bf16_.reserve(elements * 2); }

  // y = W x (accumulate: y += W x) for n rows of x. A bf16 W takes x cast to bf16 first.
  absl::Status linear(const DeviceMatrix& w, const float* x, int n, float* y,
                      bool accumulate = false);

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer x_bf16_;
  DeviceBuffer workspace_;
};

}  // namespace fpa::cuda
