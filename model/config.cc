#include "model/config.h"

#include <climits>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/json_fields.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"

namespace fpa {
namespace {

using nlohmann::json;

// Bounds that keep every index of a weight matrix, and A = n_heads * head_dim, well inside int.
constexpr int64_t kMaxAttentionWidth = 1 << 16;
constexpr int64_t kMaxTensorElements = int64_t{1} << 30;

absl::Status read_kind(const JsonFields& f, ModelConfig* c) {
  std::string kind, levels = "tied";
  FPA_RETURN_IF_ERROR(f.string("attention", &kind));
  FPA_RETURN_IF_ERROR(f.string("levels", &levels));
  if (kind == "fpa") {
    c->attention = AttentionKind::kFpa;
  } else if (kind == "fox") {
    c->attention = AttentionKind::kFox;
  } else if (kind == "softmax") {
    c->attention = AttentionKind::kSoftmax;
  } else {
    return f.error("attention",
                   absl::StrCat("is an unknown attention kind '", kind, "' (fpa, fox, softmax)"));
  }
  if (levels != "free" && levels != "tied") {
    return f.error("levels", absl::StrCat("is '", levels, "', not free or tied"));
  }
  c->free_levels = c->attention == AttentionKind::kFpa && levels == "free";
  return absl::OkStatus();
}

absl::Status read_tokenizer(const json& j, const std::string& path, ModelConfig* c) {
  auto it = j.find("tokenizer");
  if (it == j.end()) return absl::OkStatus();
  const JsonFields t(*it, path);
  std::string type;
  if (it->is_object()) FPA_RETURN_IF_ERROR(t.string("type", &type));
  if (type != "byte") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": 'tokenizer' must be {\"type\": \"byte\", ...}"));
  }
  FPA_RETURN_IF_ERROR(t.integer("bos_id", &c->bos_id, 0, INT_MAX));
  FPA_RETURN_IF_ERROR(t.integer("eos_id", &c->eos_id, 0, INT_MAX));
  FPA_RETURN_IF_ERROR(t.integer("pad_id", &c->pad_id, 0, INT_MAX));
  for (int id : {c->bos_id, c->eos_id, c->pad_id}) {
    if (id < 256 || id >= c->vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tokenizer special id ", id, " outside [256, vocab_size=", c->vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// "formats_within_bounds": {"weights": "int8", "kv": "bf16"}, either key optional.
absl::Status read_formats(const JsonFields& f, ModelConfig* c) {
  const json* v = f.find("formats_within_bounds");
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_object()) return f.error("formats_within_bounds", "must be an object");
  const JsonFields g(*v, f.path() + ": formats_within_bounds");
  FPA_RETURN_IF_ERROR(g.string("weights", &c->compact_weights));
  FPA_RETURN_IF_ERROR(g.string("kv", &c->compact_kv));
  if (c->compact_weights != "f32" && c->compact_weights != "bf16" && c->compact_weights != "int8") {
    return g.error("weights", "must be \"f32\", \"bf16\" or \"int8\"");
  }
  if (c->compact_kv != "f32" && c->compact_kv != "bf16") {
    return g.error("kv", "must be \"f32\" or \"bf16\"");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status check_config_limits(const std::string& path, const ModelConfig& c) {
  // Each product is of two bounded ints, so it is computed in 64 bits without overflow.
  if (int64_t a = int64_t{c.n_heads} * c.head_dim; a > kMaxAttentionWidth) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": n_heads * head_dim = ", a,
                                                   " is over the limit of ", kMaxAttentionWidth));
  }
  if (int64_t n = int64_t{c.vocab_size} * c.d_model; n > kMaxTensorElements) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": vocab_size * d_model = ", n,
                                                   " is over the limit of ", kMaxTensorElements));
  }
  if (int64_t n = int64_t{c.d_ff} * c.d_model; n > kMaxTensorElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": d_ff * d_model = ", n, " is over the limit of ", kMaxTensorElements));
  }
  if (c.rope_theta > 0.0f && c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": RoPE needs an even head_dim"));
  }
  return absl::OkStatus();
}

const char* attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kFpa:
      return "fpa";
    case AttentionKind::kFox:
      return "fox";
    case AttentionKind::kSoftmax:
      return "softmax";
  }
  return "?";
}

absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text,
                                               const std::string& path) {
  const json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  if (j.contains("model_type")) return parse_hf_config(j, json_text, path);
  const JsonFields f(j, path);
  std::string format;
  FPA_RETURN_IF_ERROR(f.string("format", &format));
  if (format != "fpa-serve/1") return f.error("format", "must be \"fpa-serve/1\"");
  ModelConfig c;
  c.raw_json = json_text;
  FPA_RETURN_IF_ERROR(f.required_dim("vocab_size", &c.vocab_size, 1 << 20));
  FPA_RETURN_IF_ERROR(f.required_dim("d_model", &c.d_model, 1 << 16));
  FPA_RETURN_IF_ERROR(f.required_dim("n_layers", &c.n_layers, 1024));
  FPA_RETURN_IF_ERROR(f.required_dim("n_heads", &c.n_heads, 1024));
  FPA_RETURN_IF_ERROR(f.required_dim("head_dim", &c.head_dim, 4096));
  FPA_RETURN_IF_ERROR(f.required_dim("d_ff", &c.d_ff, 1 << 18));
  FPA_RETURN_IF_ERROR(read_kind(f, &c));
  FPA_RETURN_IF_ERROR(f.number("rope_theta", &c.rope_theta, 0, 1e9));
  FPA_RETURN_IF_ERROR(f.number("norm_eps", &c.norm_eps, 1e-12, 1));
  FPA_RETURN_IF_ERROR(f.number("tau", &c.tau, 1e-6, 1e6));
  FPA_RETURN_IF_ERROR(f.boolean("tie_embeddings", &c.tie_embeddings));
  FPA_RETURN_IF_ERROR(f.integer("train_len", &c.train_len, 0, 1 << 24));
  if (c.attention != AttentionKind::kSoftmax) c.rope_theta = 0.0f;
  if (c.vocab_size < 259) {
    return f.error("vocab_size", "cannot hold the byte tokenizer (259)");
  }
  FPA_RETURN_IF_ERROR(check_config_limits(path, c));
  FPA_RETURN_IF_ERROR(read_tokenizer(j, path, &c));
  FPA_RETURN_IF_ERROR(read_formats(f, &c));
  return c;
}

}  // namespace fpa
