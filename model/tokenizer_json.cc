// tokenizer.json (Hugging Face tokenizers) of a byte-level BPE model: the model, the
// pre-tokenizer (ByteLevel, or a regex Split then ByteLevel without its own regex), the
// post-processor's BOS, and the added tokens. Anything else is refused naming its key.
#include "absl/strings/str_cat.h"
#include "model/json_fields.h"
#include "model/pretokenizer.h"
#include "model/status_macros.h"
#include "model/tokenizer_files.h"

namespace fpa {
namespace {

using nlohmann::json;

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

absl::Status read_model(const json& model, const std::string& path, BpeSpec& spec) {
  if (type_of(model) != "BPE") return refuse(path, "model.type", "must be BPE");
  const JsonFields f(model, path);
  for (const char* key : {"dropout", "unk_token"}) {
    // TODO(issue 25): BPE dropout and an unknown token (byte-level BPE needs neither).
    if (f.find(key) != nullptr) return refuse(path, absl::StrCat("model.", key), "must be null");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    std::string affix;
    FPA_RETURN_IF_ERROR(f.string(key, &affix));
    if (!affix.empty()) return refuse(path, absl::StrCat("model.", key), "is not supported");
  }
  bool byte_fallback = false;
  FPA_RETURN_IF_ERROR(f.boolean("byte_fallback", &byte_fallback));
  if (byte_fallback) return refuse(path, "model.byte_fallback", "is not supported");
  FPA_RETURN_IF_ERROR(f.boolean("ignore_merges", &spec.ignore_merges));
  FPA_RETURN_IF_ERROR(read_vocab(model.value("vocab", json()), path, spec));
  const json* merges = f.find("merges");
  if (merges == nullptr || !merges->is_array()) return refuse(path, "model.merges", "is missing");
  for (const json& m : *merges) FPA_RETURN_IF_ERROR(add_merge(m, path, spec.merges.size(), spec));
  return absl::OkStatus();
}

// ByteLevel's own options; `regex_allowed`: whether it may split by GPT-2's pattern itself.
absl::Status read_byte_level(const json& p, const std::string& path, const std::string& key,
                             bool regex_allowed, BpeSpec& spec) {
  const JsonFields f(p, path);
  bool use_regex = true;
  FPA_RETURN_IF_ERROR(f.boolean("use_regex", &use_regex));
  FPA_RETURN_IF_ERROR(f.boolean("add_prefix_space", &spec.add_prefix_space));
  if (use_regex && !regex_allowed) {
    return refuse(path, key + ".use_regex", "must be false after a Split");
  }
  if (use_regex) spec.pattern = kGpt2Pattern;
  return absl::OkStatus();
}

absl::Status read_split(const json& p, const std::string& path, const std::string& key,
                        BpeSpec& spec) {
  const json* regex =
      p.contains("pattern") && p["pattern"].is_object() && p["pattern"].contains("Regex")
          ? &p["pattern"]["Regex"]
          : nullptr;
  if (regex == nullptr || !regex->is_string()) {
    return refuse(path, key + ".pattern", "must be {\"Regex\": ...}");
  }
  if (p.value("behavior", "") != "Isolated" || p.value("invert", false)) {
    return refuse(path, key + ".behavior", "must be Isolated, not inverted");
  }
  spec.pattern = regex->get<std::string>();
  return absl::OkStatus();
}

absl::Status read_pre_tokenizer(const json& p, const std::string& path, BpeSpec& spec) {
  if (type_of(p) == "ByteLevel") return read_byte_level(p, path, "pre_tokenizer", true, spec);
  const json* steps =
      type_of(p) == "Sequence" && p.contains("pretokenizers") ? &p["pretokenizers"] : nullptr;
  if (steps == nullptr || !steps->is_array() || steps->size() != 2 ||
      type_of((*steps)[0]) != "Split" || type_of((*steps)[1]) != "ByteLevel") {
    // TODO(issue 25): other pre-tokenizers (Metaspace, Digits, ...) for non-byte-level models.
    return refuse(path, "pre_tokenizer", "must be ByteLevel, or a Sequence of Split and ByteLevel");
  }
  FPA_RETURN_IF_ERROR(read_split((*steps)[0], path, "pre_tokenizer.pretokenizers[0]", spec));
  return read_byte_level((*steps)[1], path, "pre_tokenizer.pretokenizers[1]", false, spec);
}

// The BOS a TemplateProcessing post-processor puts before a single sequence.
absl::Status read_post_processor(const json& p, const std::string& path, BpeSpec& spec) {
  const std::string type = type_of(p);
  if (p.is_null() || type == "ByteLevel") return absl::OkStatus();
  const json* single =
      type == "TemplateProcessing" && p.contains("single") ? &p["single"] : nullptr;
  if (single == nullptr || !single->is_array() || single->empty() || single->size() > 2 ||
      !single->back().contains("Sequence")) {
    return refuse(path, "post_processor", "must be null, ByteLevel or [BOS] + $A templating");
  }
  if (single->size() == 1) return absl::OkStatus();
  const json& first = (*single)[0];
  std::string name = first.contains("SpecialToken") ? first["SpecialToken"].value("id", "") : "";
  const json& tokens = p.value("special_tokens", json::object());
  if (name.empty() || !tokens.contains(name) || !tokens[name].contains("ids") ||
      tokens[name]["ids"].size() != 1 || !tokens[name]["ids"][0].is_number_integer()) {
    return refuse(path, "post_processor.single", "must start with one special token");
  }
  spec.special.bos = tokens[name]["ids"][0].get<int32_t>();
  spec.add_bos = true;
  return absl::OkStatus();
}

}  // namespace

absl::Status read_tokenizer_json(const std::string& path, BpeSpec& spec) {
  absl::StatusOr<json> j = read_json_object(path);
  if (!j.ok()) return j.status();
  const JsonFields f(*j, path);
  // TODO(issue 25): normalizers (NFC, Lowercase, ...); byte-level models use none.
  if (f.find("normalizer") != nullptr) return refuse(path, "normalizer", "must be null");
  if (f.find("model") == nullptr) return refuse(path, "model", "is missing");
  FPA_RETURN_IF_ERROR(read_model((*j)["model"], path, spec));
  const json* pre = f.find("pre_tokenizer");
  if (pre == nullptr) return refuse(path, "pre_tokenizer", "is missing (byte-level BPE needs one)");
  FPA_RETURN_IF_ERROR(read_pre_tokenizer(*pre, path, spec));
  const json* decoder = f.find("decoder");
  if (decoder != nullptr && type_of(*decoder) != "ByteLevel") {
    return refuse(path, "decoder", "must be ByteLevel");
  }
  FPA_RETURN_IF_ERROR(read_post_processor(j->value("post_processor", json()), path, spec));
  if (const json* added = f.find("added_tokens")) {
    if (!added->is_array()) return refuse(path, "added_tokens", "must be an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const std::string key = absl::StrCat("added_tokens[", i, "]");
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= (1 << 24)) {
        return refuse(path, key + ".id", "must be an id in [0, 2^24)");
      }
      FPA_RETURN_IF_ERROR(read_added_token(t, key, path, t["id"].get<int32_t>(), spec));
    }
  }
  return absl::OkStatus();
}

}  // namespace fpa
