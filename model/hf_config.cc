// config.json of the Forgetting Transformer family in Hugging Face format (the FoX repository,
// zhixuan-lin/forgetting-transformer at 883f260c): ForgettingTransformerConfig (model_type
// "forgetting_transformer-project_fox") and the Transformer baseline's TransformerConfig
// ("transformer-project_fox"), with the published code's defaults. Every key is either read,
// known to have no effect on inference, or refused by name.
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/json_fields.h"
#include "model/status_macros.h"

namespace fpa {
namespace {

using nlohmann::json;

// Keys of any PretrainedConfig, and training-only options, that do not change the forward pass.
const std::set<std::string>& no_effect_keys() {
  static const std::set<std::string> keys = {
      "model_type", "architectures", "transformers_version", "torch_dtype", "_name_or_path",
      "auto_map", "use_cache", "initializer_range", "fuse_norm", "fuse_cross_entropy",
      "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
      "pad_token_id", "max_position_embeddings",
      // The Triton kernel's adaptive computation pruning: fpa-serve's own eviction at tau
      // replaces it (docs/model-format.md).
      "log_pruning_tolerance"};
  return keys;
}

// Keys read below, per family.
const std::set<std::string> kCommonKeys = {
    "vocab_size", "hidden_size",  "hidden_ratio", "intermediate_size",   "num_hidden_layers",
    "num_heads",  "num_kv_heads", "hidden_act",   "window_size",         "elementwise_affine",
    "norm_eps",   "bos_token_id", "eos_token_id", "tie_word_embeddings", "attention_bias",
    "rope_base",  "use_rope"};
const std::set<std::string> kFoxKeys = {
    "use_output_gate", "ogate_act",      "fgate_type",
    "fgate_bias_init", "decay_time_min", "decay_time_max",
    "use_output_norm", "qk_norm",        "qk_norm_share_param_across_head",
    "use_k_shift",     "use_v_shift"};

// A key that must keep a given value: `value` is what the server implements.
// (A null value is the default: absent.)
absl::Status require(const JsonFields& f, const char* key, const json& value,
                     const std::string& why) {
  const json* v = f.find(key);
  if (v == nullptr || *v == value) return absl::OkStatus();
  return f.error(
      key, absl::StrCat("= ", v->dump(), " is not supported (only ", value.dump(), "): ", why));
}

// The Pro options of FoX and the forget gate's variants.
absl::Status read_fox_options(const JsonFields& f, ModelConfig& c) {
  FPA_RETURN_IF_ERROR(f.boolean("use_k_shift", &c.k_shift));
  FPA_RETURN_IF_ERROR(f.boolean("use_v_shift", &c.v_shift));
  FPA_RETURN_IF_ERROR(f.boolean("qk_norm", &c.qk_norm));
  FPA_RETURN_IF_ERROR(f.boolean("qk_norm_share_param_across_head", &c.qk_norm_shared));
  FPA_RETURN_IF_ERROR(f.boolean("use_output_norm", &c.output_norm));
  FPA_RETURN_IF_ERROR(f.boolean("use_output_gate", &c.output_gate));
  std::string act = "sigmoid";
  FPA_RETURN_IF_ERROR(f.string("ogate_act", &act));
  if (act != "sigmoid" && act != "silu") return f.error("ogate_act", "must be sigmoid or silu");
  if (c.output_norm && c.output_gate && act != "sigmoid") {
    return f.error("ogate_act", "must be sigmoid with use_output_norm (the published code's too)");
  }
  c.output_gate_silu = act == "silu";
  FPA_RETURN_IF_ERROR(require(f, "fgate_type", "full", "only the data-dependent forget gate"));
  FPA_RETURN_IF_ERROR(require(f, "fgate_bias_init", false, "bias-only forget gates"));
  for (const char* key : {"decay_time_min", "decay_time_max"}) {
    if (f.find(key) != nullptr) return f.error(key, "must be null: bias-only forget gates");
  }
  return require(f, "use_rope", false, "RoPE beside the forget gate");
}

// MLP width: intermediate_size, else the published rule from hidden_ratio (default 4):
// int(hidden_size * hidden_ratio * 2 / 3) rounded up to a multiple of 256.
absl::Status read_d_ff(const JsonFields& f, ModelConfig& c) {
  FPA_RETURN_IF_ERROR(f.integer("intermediate_size", &c.d_ff, 1, 1 << 18));
  if (c.d_ff > 0) return absl::OkStatus();
  float ratio = 4.0f;
  FPA_RETURN_IF_ERROR(f.number("hidden_ratio", &ratio, 1e-3, 1e3));
  const json* r = f.find("hidden_ratio");
  const double exact = r == nullptr ? 4.0 : r->get<double>();  // as Python computes it
  const int64_t width = static_cast<int64_t>(c.d_model * exact * 2 / 3);
  c.d_ff = static_cast<int>(256 * ((width + 255) / 256));
  return absl::OkStatus();
}

absl::Status check_keys(const json& j, const std::string& path, bool fox) {
  for (const auto& [key, value] : j.items()) {
    if (kCommonKeys.contains(key) || no_effect_keys().contains(key) ||
        (fox && kFoxKeys.contains(key))) {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": '", key, "' is an option fpa-serve does not know"));
  }
  return absl::OkStatus();
}

}  // namespace

// A checkpoint saved in bfloat16 (the published ones are) loses nothing when the CPU multiplies
// its weights as stored, so --cpu-weights auto may pick bf16 for it; a float32 one keeps f32
// until a compact format's loss on it is measured (kernels/cpu/formats.h).
absl::Status read_stored_precision(const JsonFields& f, ModelConfig& c) {
  std::string dtype;
  FPA_RETURN_IF_ERROR(f.string("torch_dtype", &dtype));
  if (dtype == "bfloat16") c.compact_weights = "bf16";
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> parse_hf_config(const json& j, const std::string& json_text,
                                            const std::string& path) {
  const JsonFields f(j, path);
  std::string type;
  FPA_RETURN_IF_ERROR(f.string("model_type", &type));
  const bool fox = type == "forgetting_transformer" || type == "forgetting_transformer-project_fox";
  if (!fox && type != "transformer" && type != "transformer-project_fox") {
    return f.error("model_type", absl::StrCat("is '", type,
                                              "', not forgetting_transformer(-project_fox) or "
                                              "transformer(-project_fox)"));
  }
  FPA_RETURN_IF_ERROR(check_keys(j, path, fox));
  ModelConfig c;
  c.raw_json = json_text;
  c.layout = WeightLayout::kHuggingFace;
  c.attention = fox ? AttentionKind::kFox : AttentionKind::kSoftmax;
  c.norm_eps = 1e-6f;
  c.bos_id = 1;  // the published configs' defaults
  c.eos_id = 2;
  c.pad_id = -1;
  FPA_RETURN_IF_ERROR(f.required_dim("vocab_size", &c.vocab_size, 1 << 20));
  FPA_RETURN_IF_ERROR(f.required_dim("hidden_size", &c.d_model, 1 << 16));
  FPA_RETURN_IF_ERROR(f.required_dim("num_hidden_layers", &c.n_layers, 1024));
  FPA_RETURN_IF_ERROR(f.required_dim("num_heads", &c.n_heads, 1024));
  if (c.d_model % c.n_heads != 0) return f.error("num_heads", "must divide hidden_size");
  c.head_dim = c.d_model / c.n_heads;
  FPA_RETURN_IF_ERROR(read_d_ff(f, c));
  int kv_heads = c.n_heads;
  FPA_RETURN_IF_ERROR(f.integer("num_kv_heads", &kv_heads, 1, 1024));
  // TODO(issue 25): grouped KV heads (the published FoX code refuses them too).
  if (kv_heads != c.n_heads) return f.error("num_kv_heads", "must equal num_heads (or be null)");
  FPA_RETURN_IF_ERROR(require(f, "hidden_act", "swish", "the MLP is SwiGLU"));
  if (f.find("window_size") != nullptr) return f.error("window_size", "must be null");
  FPA_RETURN_IF_ERROR(require(f, "attention_bias", false, "projections have no bias"));
  FPA_RETURN_IF_ERROR(require(f, "elementwise_affine", true, "RMSNorms have weights"));
  FPA_RETURN_IF_ERROR(f.number("norm_eps", &c.norm_eps, 1e-12, 1));
  FPA_RETURN_IF_ERROR(f.boolean("tie_word_embeddings", &c.tie_embeddings));
  FPA_RETURN_IF_ERROR(f.integer("bos_token_id", &c.bos_id, 0, c.vocab_size - 1));
  FPA_RETURN_IF_ERROR(f.integer("eos_token_id", &c.eos_id, 0, c.vocab_size - 1));
  FPA_RETURN_IF_ERROR(f.integer("max_position_embeddings", &c.train_len, 0, 1 << 24));
  if (fox) {
    FPA_RETURN_IF_ERROR(read_fox_options(f, c));
  } else {
    bool rope = true;
    c.rope_theta = 500000.0f;
    FPA_RETURN_IF_ERROR(f.boolean("use_rope", &rope));
    FPA_RETURN_IF_ERROR(f.number("rope_base", &c.rope_theta, 1, 1e9));
    if (!rope) c.rope_theta = 0.0f;
  }
  FPA_RETURN_IF_ERROR(read_stored_precision(f, c));
  FPA_RETURN_IF_ERROR(check_config_limits(path, c));
  return c;
}

}  // namespace fpa
