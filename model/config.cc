#include "model/config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"

namespace fpa {
namespace {

using nlohmann::json;

// Typed field readers: an absent (or null) field keeps the default, a wrong type is an error
// naming the file and the key (nlohmann's own accessors would throw instead).
class Fields {
 public:
  Fields(const json& j, const std::string& path) : j_(j), path_(path) {}

  absl::Status integer(const char* key, int* out, int min_value) const {
    if (const json* v = find(key)) {
      if (!v->is_number_integer() || v->get<int64_t>() < min_value ||
          v->get<int64_t>() > (1 << 24)) {
        return error(key, absl::StrCat("must be an integer >= ", min_value));
      }
      *out = v->get<int>();
    }
    return absl::OkStatus();
  }
  absl::Status required_positive(const char* key, int* out) const {
    if (find(key) == nullptr) return error(key, "is missing");
    return integer(key, out, 1);
  }
  absl::Status number(const char* key, float* out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) return error(key, "must be a number");
      *out = v->get<float>();
    }
    return absl::OkStatus();
  }
  absl::Status boolean(const char* key, bool* out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) return error(key, "must be true or false");
      *out = v->get<bool>();
    }
    return absl::OkStatus();
  }
  absl::Status string(const char* key, std::string* out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) return error(key, "must be a string");
      *out = v->get<std::string>();
    }
    return absl::OkStatus();
  }
  absl::Status error(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": '", key, "' ", what));
  }

 private:
  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  const json& j_;
  const std::string& path_;
};

absl::Status read_kind(const Fields& f, ModelConfig* c) {
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
  const Fields t(*it, path);
  std::string type;
  if (it->is_object()) FPA_RETURN_IF_ERROR(t.string("type", &type));
  if (type != "byte") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": 'tokenizer' must be {\"type\": \"byte\", ...}"));
  }
  FPA_RETURN_IF_ERROR(t.integer("bos_id", &c->bos_id, 0));
  FPA_RETURN_IF_ERROR(t.integer("eos_id", &c->eos_id, 0));
  FPA_RETURN_IF_ERROR(t.integer("pad_id", &c->pad_id, 0));
  for (int id : {c->bos_id, c->eos_id, c->pad_id}) {
    if (id < 256 || id >= c->vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tokenizer special id ", id, " outside [256, vocab_size=", c->vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status check_ranges(const std::string& path, const ModelConfig& c) {
  if (c.vocab_size < 259) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocab_size ", c.vocab_size, " cannot hold the byte tokenizer (259)"));
  }
  if (c.rope_theta < 0.0f || (c.rope_theta > 0.0f && c.head_dim % 2 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": RoPE needs rope_theta >= 0 and an even head_dim"));
  }
  if (!(c.norm_eps > 0.0f) || !(c.tau > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": norm_eps and tau must be > 0"));
  }
  return absl::OkStatus();
}

}  // namespace

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
  const Fields f(j, path);
  std::string format;
  FPA_RETURN_IF_ERROR(f.string("format", &format));
  if (format != "fpa-serve/1") return f.error("format", "must be \"fpa-serve/1\"");
  ModelConfig c;
  c.raw_json = json_text;
  FPA_RETURN_IF_ERROR(f.required_positive("vocab_size", &c.vocab_size));
  FPA_RETURN_IF_ERROR(f.required_positive("d_model", &c.d_model));
  FPA_RETURN_IF_ERROR(f.required_positive("n_layers", &c.n_layers));
  FPA_RETURN_IF_ERROR(f.required_positive("n_heads", &c.n_heads));
  FPA_RETURN_IF_ERROR(f.required_positive("head_dim", &c.head_dim));
  FPA_RETURN_IF_ERROR(f.required_positive("d_ff", &c.d_ff));
  FPA_RETURN_IF_ERROR(read_kind(f, &c));
  FPA_RETURN_IF_ERROR(f.number("rope_theta", &c.rope_theta));
  FPA_RETURN_IF_ERROR(f.number("norm_eps", &c.norm_eps));
  FPA_RETURN_IF_ERROR(f.number("tau", &c.tau));
  FPA_RETURN_IF_ERROR(f.boolean("tie_embeddings", &c.tie_embeddings));
  FPA_RETURN_IF_ERROR(f.integer("train_len", &c.train_len, 0));
  if (c.attention != AttentionKind::kSoftmax) c.rope_theta = 0.0f;
  FPA_RETURN_IF_ERROR(check_ranges(path, c));
  FPA_RETURN_IF_ERROR(read_tokenizer(j, path, &c));
  return c;
}

}  // namespace fpa
