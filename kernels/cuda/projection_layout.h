// Where a layer's projections sit in the rows the CUDA backend's two fused GEMMs write, and so
// which of FoX Pro's stages a layer runs (free of CUDA, so CPU-only builds test it):
//  - the qkv row: q | k | v, then FoX Pro's output gate (ogate x), in the step's weight precision;
//  - the field row: the field's pre-activations, the free levels' offsets, then FoX Pro's key and
//    value shift gates, always float32 (the field drives eviction; the CPU backend keeps the
//    shift gates float32 too).
#pragma once

#include <vector>

#include "model/model.h"

namespace fpa::cuda {

// FoX Pro's QK-norm eps: the published code's GroupNorm default, whatever norm_eps says (the CPU
// backend's too).
inline constexpr float kQkNormEps = 1e-5f;

// Columns of the fused rows; -1 where the model lacks the part.
struct ProjectionLayout {
  int attn_width = 0;  // n_heads * head_dim: q at 0, k at attn_width, v at 2 * attn_width
  int qkv_stride = 0;
  int ogate_col = -1;    // output_gate: [attn_width] columns
  int field_stride = 0;  // 0: no field row at all
  bool field = false;    // the field (and levels) at 0: every model but softmax
  int level_col = -1;    // free levels: [n_heads] columns
  int k_shift_col = -1;  // k_shift: [n_heads] columns of the gate's pre-activation
  int v_shift_col = -1;  // v_shift: likewise
};
ProjectionLayout projection_layout(const ModelConfig& c);

// The matrices stacked into each fused row, in the layout's order (DeviceWeights uploads them).
std::vector<const Matrix*> qkv_parts(const ModelConfig& c, const LayerWeights& w);
std::vector<const Matrix*> field_parts(const ModelConfig& c, const LayerWeights& w);

}  // namespace fpa::cuda
