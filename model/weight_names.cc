#include "model/weight_names.h"

#include "absl/strings/str_cat.h"

namespace fpa {

WeightNames weight_names(WeightLayout layout) {
  if (layout == WeightLayout::kHuggingFace) {
    return {"model.embeddings.weight", "model.norm.weight", "lm_head.weight"};
  }
  return {"embed.weight", "final_norm.weight", "lm_head.weight"};
}

LayerNames layer_names(const ModelConfig& config, int layer) {
  LayerNames n;
  if (config.layout == WeightLayout::kHuggingFace) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    n.attn_norm = p + "attn_norm.weight";
    n.wq = p + "attn.q_proj.weight";
    n.wk = p + "attn.k_proj.weight";
    n.wv = p + "attn.v_proj.weight";
    n.wo = p + "attn.o_proj.weight";
    n.field_w = p + "attn.fgate_proj.weight";  // log f = logsigmoid(fgate_proj x)
    n.field_b = p + "attn.fgate_proj.bias";
    n.q_norm = p + "attn.q_norm.weight";
    n.k_norm = p + "attn.k_norm.weight";
    n.ogate = p + "attn.ogate_proj.weight";
    n.out_norm = p + "attn.output_norm.weight";
    // A shifted projection is a ShiftLinear: its Linear and its shift_proj (no bias).
    if (config.k_shift) {
      n.wk = p + "attn.k_proj.linear.weight";
      n.k_shift = p + "attn.k_proj.shift_proj.weight";
    }
    if (config.v_shift) {
      n.wv = p + "attn.v_proj.linear.weight";
      n.v_shift = p + "attn.v_proj.shift_proj.weight";
    }
    n.mlp_norm = p + "mlp_norm.weight";
    n.gate_up = p + "mlp.gate_proj.weight";  // gate, y = gate_proj(x).chunk(2)
    n.w_down = p + "mlp.down_proj.weight";
    return n;
  }
  const std::string p = absl::StrCat("layers.", layer, ".");
  n.attn_norm = p + "attn_norm.weight";
  n.wq = p + "attn.wq";
  n.wk = p + "attn.wk";
  n.wv = p + "attn.wv";
  n.wo = p + "attn.wo";
  n.field_w = p + "attn.field_w";
  n.field_b = p + "attn.field_b";
  n.level_w = p + "attn.level_w";
  n.level_b = p + "attn.level_b";
  n.beta_raw = p + "attn.beta_raw";
  n.mlp_norm = p + "mlp_norm.weight";
  n.w_gate = p + "mlp.w_gate";
  n.w_up = p + "mlp.w_up";
  n.w_down = p + "mlp.w_down";
  return n;
}

}  // namespace fpa
