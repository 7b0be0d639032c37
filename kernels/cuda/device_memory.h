// Owning device allocations and CUDA / cuBLAS error conversion to absl::Status.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fpa::cuda {

inline absl::Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

inline absl::Status cublas_status(cublasStatus_t err, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(err)));
}

// A device allocation that only grows (scratch) or is sized once (pool, weights).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }

  // Makes the buffer hold at least `bytes` (contents are not kept when it grows).
  absl::Status reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    if (absl::Status s = cuda_status(cudaMalloc(&ptr_, bytes), "cudaMalloc"); !s.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device allocation of ", bytes, " bytes failed: ", s.message()));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Copies a host array into `buf` (grown as needed), ordered on `stream`.
template <typename T>
absl::Status upload(DeviceBuffer& buf, const T* data, size_t count, cudaStream_t stream) {
  if (absl::Status s = buf.reserve(count * sizeof(T)); !s.ok()) return s;
  if (count == 0) return absl::OkStatus();
  return cuda_status(
      cudaMemcpyAsync(buf.as<void>(), data, count * sizeof(T), cudaMemcpyHostToDevice, stream),
      "upload");
}

}  // namespace fpa::cuda
