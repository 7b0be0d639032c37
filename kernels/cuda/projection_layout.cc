#include "kernels/cuda/projection_layout.h"

namespace fpa::cuda {

ProjectionLayout projection_layout(const ModelConfig& c) {
  ProjectionLayout p;
  p.attn_width = c.n_heads * c.head_dim;
  p.qkv_stride = 3 * p.attn_width;
  if (c.output_gate) {
    p.ogate_col = p.qkv_stride;
    p.qkv_stride += p.attn_width;
  }
  p.field = c.attention != AttentionKind::kSoftmax;
  if (p.field) p.field_stride = c.n_heads;
  if (p.field && c.free_levels) {
    p.level_col = p.field_stride;
    p.field_stride += c.n_heads;
  }
  if (c.k_shift) {
    p.k_shift_col = p.field_stride;
    p.field_stride += c.n_heads;
  }
  if (c.v_shift) {
    p.v_shift_col = p.field_stride;
    p.field_stride += c.n_heads;
  }
  return p;
}

std::vector<const Matrix*> qkv_parts(const ModelConfig& c, const LayerWeights& w) {
  std::vector<const Matrix*> parts{&w.wq, &w.wk, &w.wv};
  if (c.output_gate) parts.push_back(&w.ogate);
  return parts;
}

std::vector<const Matrix*> field_parts(const ModelConfig& c, const LayerWeights& w) {
  std::vector<const Matrix*> parts;
  if (c.attention != AttentionKind::kSoftmax) {
    parts.push_back(&w.field_w);
    if (c.free_levels) parts.push_back(&w.level_w);
  }
  if (c.k_shift) parts.push_back(&w.k_shift);
  if (c.v_shift) parts.push_back(&w.v_shift);
  return parts;
}

}  // namespace fpa::cuda
