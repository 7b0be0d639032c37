// The tensor names of each weight layout (docs/model-format.md): fpa-serve/1's own, and the
// Forgetting Transformer family's Hugging Face names (ForgettingTransformerForCausalLM and
// TransformerForCausalLM in the FoX repository).
#pragma once

#include <string>

#include "model/model.h"

namespace fpa {

struct LayerNames {
  std::string attn_norm, wq, wk, wv, wo;
  std::string field_w, field_b, level_w, level_b, beta_raw;
  std::string q_norm, k_norm, ogate, out_norm, k_shift, v_shift;  // FoX Pro
  std::string mlp_norm;
  std::string w_gate, w_up;  // separate matrices; both empty when fused
  std::string gate_up;       // fused [2 d_ff, d_model]: the gate's rows, then the up rows
  std::string w_down;
};

struct WeightNames {
  std::string embed, final_norm, lm_head;
};

WeightNames weight_names(WeightLayout layout);
LayerNames layer_names(const ModelConfig& config, int layer);

}  // namespace fpa
