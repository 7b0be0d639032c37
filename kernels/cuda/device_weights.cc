#include "kernels/cuda/device_weights.h"

#include <cstring>

#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/projection_layout.h"

namespace fpa::cuda {

// Stacks the parts' rows (all of the same width) into one device matrix.
absl::StatusOr<DeviceMatrix> DeviceWeights::matrix(const std::vector<const Matrix*>& parts,
                                                   bool bf16, cudaStream_t stream) {
  DeviceMatrix out;
  out.cols = parts.front()->cols;
  out.bf16 = bf16;
  std::vector<float> host;
  for (const Matrix* m : parts) {
    if (m->cols != out.cols) return absl::InvalidArgumentError("fused matrices differ in width");
    host.insert(host.end(), m->data, m->data + static_cast<size_t>(m->rows) * m->cols);
    out.rows += m->rows;
  }
  DeviceBuffer f32;
  if (absl::Status s = cuda::upload(f32, host.data(), host.size(), stream); !s.ok()) return s;
  if (bf16) {
    DeviceBuffer half;
    if (absl::Status s = half.reserve(host.size() * 2); !s.ok()) return s;
    if (absl::Status s = launch_to_bf16(f32.as<float>(), host.size(), half.as<void>(), stream);
        !s.ok()) {
      return s;
    }
    // f32 is freed on return: the cast must be done first.
    if (absl::Status s = cuda_status(cudaStreamSynchronize(stream), "weights upload"); !s.ok()) {
      return s;
    }
    f32 = std::move(half);
  }
  out.data = f32.as<void>();
  buffers_.push_back(std::move(f32));
  return out;
}

absl::StatusOr<const float*> DeviceWeights::array(std::span<const float> v, cudaStream_t stream) {
  DeviceBuffer buf;
  if (absl::Status s = cuda::upload(buf, v.data(), v.size(), stream); !s.ok()) return s;
  const float* p = buf.as<float>();
  buffers_.push_back(std::move(buf));
  return p;
}

#define FPA_ASSIGN(lhs, expr)                 \
  do {                                        \
    auto value_ = (expr);                     \
    if (!value_.ok()) return value_.status(); \
    lhs = *value_;                            \
  } while (0)

absl::Status DeviceWeights::upload(const Model& model, bool bf16, cudaStream_t stream) {
  const ModelConfig& cfg = model.config();
  for (const LayerWeights& w : model.layers()) {
    DeviceLayer d;
    FPA_ASSIGN(d.qkv, matrix(qkv_parts(cfg, w), bf16, stream));
    FPA_ASSIGN(d.wo, matrix({&w.wo}, bf16, stream));
    FPA_ASSIGN(d.gate_up, matrix({&w.w_gate, &w.w_up}, bf16, stream));
    FPA_ASSIGN(d.down, matrix({&w.w_down}, bf16, stream));
    FPA_ASSIGN(d.attn_norm, array(w.attn_norm, stream));
    FPA_ASSIGN(d.mlp_norm, array(w.mlp_norm, stream));
    FPA_ASSIGN(d.beta, array(w.beta, stream));
    if (const std::vector<const Matrix*> field = field_parts(cfg, w); !field.empty()) {
      FPA_ASSIGN(d.field, matrix(field, false, stream));
    }
    if (cfg.attention != AttentionKind::kSoftmax) {
      FPA_ASSIGN(d.field_b, array(w.field_b, stream));
      if (cfg.free_levels) FPA_ASSIGN(d.level_b, array(w.level_b, stream));
    }
    if (cfg.qk_norm) {
      FPA_ASSIGN(d.q_norm, array(w.q_norm, stream));
      FPA_ASSIGN(d.k_norm, array(w.k_norm, stream));
    }
    if (cfg.output_norm) FPA_ASSIGN(d.out_norm, array(w.out_norm, stream));
    layers_.push_back(d);
  }
  const Matrix& embed = model.embed();
  FPA_ASSIGN(embed_,
             array(std::span<const float>(embed.data, static_cast<size_t>(embed.rows) * embed.cols),
                   stream));
  FPA_ASSIGN(final_norm_, array(model.final_norm(), stream));
  FPA_ASSIGN(lm_head_, matrix({&model.lm_head()}, bf16, stream));
  return cuda_status(cudaStreamSynchronize(stream), "weights upload");
}

#undef FPA_ASSIGN

}  // namespace fpa::cuda
