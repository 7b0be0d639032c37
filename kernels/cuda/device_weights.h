// The model's weights on the device: projections fused per layer (q|k|v|ogate, gate|up) in bf16
// or float32, the field's row (field, levels, FoX Pro's shift gates) always float32 (it drives
// eviction), norms float32.
#pragma once

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"
#include "model/model.h"

namespace fpa::cuda {

// The fused rows' parts and columns: projection_layout.h.
struct DeviceLayer {
  DeviceMatrix qkv;      // [qkv_stride, d_model]: q | k | v | ogate (output gate)
  DeviceMatrix field;    // [field_stride, d_model]: field | level | k_shift | v_shift
  DeviceMatrix wo;       // [d_model, A]
  DeviceMatrix gate_up;  // [2 d_ff, d_model]
  DeviceMatrix down;     // [d_model, d_ff]
  const float* attn_norm = nullptr;
  const float* mlp_norm = nullptr;
  const float* field_b = nullptr;
  const float* level_b = nullptr;  // free levels only
  const float* beta = nullptr;     // [H]
  const float* q_norm = nullptr;   // [A], or [head_dim] shared by the heads (qk_norm)
  const float* k_norm = nullptr;
  const float* out_norm = nullptr;  // [A] (output_norm)
};

class DeviceWeights {
 public:
  absl::Status upload(const Model& model, bool bf16, cudaStream_t stream);

  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const float* embed() const { return embed_; }
  const float* final_norm() const { return final_norm_; }
  const DeviceMatrix& lm_head() const { return lm_head_; }

 private:
  absl::StatusOr<DeviceMatrix> matrix(const std::vector<const Matrix*>& parts, bool bf16,
                                      cudaStream_t stream);
  absl::StatusOr<const float*> array(std::span<const float> v, cudaStream_t stream);

  std::vector<DeviceBuffer> buffers_;
  std::vector<DeviceLayer> layers_;
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  DeviceMatrix lm_head_;
};

}  // namespace fpa::cuda
