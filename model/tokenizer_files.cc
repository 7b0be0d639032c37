// load_tokenizer: a model directory's tokenizer files -> BpeSpec (or the byte tokenizer).
// Options these files can set that the tokenizer does not implement are refused, naming the
// file and key.
#include "model/tokenizer_files.h"

#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "model/bpe.h"
#include "model/byte_level.h"
#include "model/json_fields.h"
#include "model/model.h"
#include "model/model_chat_template.h"
#include "model/pretokenizer.h"
#include "model/status_macros.h"
#include "model/tokenizer.h"

namespace fpa {
using nlohmann::json;

absl::Status refuse(const std::string& path, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": '", key, "' ", what));
}

std::string entry_bytes(const std::string& spelled) {
  return byte_level::to_bytes(spelled).value_or(spelled);
}

absl::Status read_vocab(const json& vocab, const std::string& path, BpeSpec& spec) {
  if (!vocab.is_object()) return refuse(path, "vocab", "must be an object of token -> id");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
      return refuse(path, "vocab", absl::StrCat("id of '", token, "' is not in [0, 2^24)"));
    }
    size_t i = id.get<size_t>();
    if (i >= spec.vocab.size()) spec.vocab.resize(i + 1);
    spec.vocab[i] = entry_bytes(token);
  }
  return absl::OkStatus();
}

// One merge, "a b" (merges.txt, older tokenizer.json) or ["a", "b"].
absl::Status add_merge(const json& m, const std::string& path, size_t rank, BpeSpec& spec) {
  std::string a, b;
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return refuse(path, "merges", absl::StrCat("entry ", rank, " is not two tokens"));
    }
    a = s.substr(0, space);
    b = s.substr(space + 1);
  } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    a = m[0].get<std::string>();
    b = m[1].get<std::string>();
  } else {
    return refuse(path, "merges", absl::StrCat("entry ", rank, " is not two tokens"));
  }
  spec.merges.emplace_back(entry_bytes(a), entry_bytes(b));
  return absl::OkStatus();
}

absl::Status read_added_token(const json& t, const std::string& key, const std::string& path,
                              int32_t id, BpeSpec& spec) {
  const JsonFields f(t, path);
  std::string content;
  bool special = false, flag = false;
  FPA_RETURN_IF_ERROR(f.string("content", &content));
  FPA_RETURN_IF_ERROR(f.boolean("special", &special));
  for (const char* unsupported : {"lstrip", "rstrip", "single_word"}) {
    FPA_RETURN_IF_ERROR(f.boolean(unsupported, &flag));
    // TODO(issue 25): added tokens that strip or match whole words only.
    if (flag) return refuse(path, absl::StrCat(key, ".", unsupported), "is not supported");
  }
  for (AddedToken& known : spec.added) {
    if (known.id == id) {  // tokenizer_config.json repeating tokenizer.json
      known = {id, content, special};
      return absl::OkStatus();
    }
  }
  spec.added.push_back({id, content, special});
  return absl::OkStatus();
}

namespace {

absl::Status read_merges_txt(const std::string& path, BpeSpec& spec) {
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    FPA_RETURN_IF_ERROR(add_merge(json(line), path, spec.merges.size(), spec));
  }
  return absl::OkStatus();
}

// A special token in tokenizer_config.json / special_tokens_map.json: "text" or {"content": ...}.
std::optional<std::string> token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<int32_t> id_of(const BpeSpec& spec, const std::string& text) {
  for (const AddedToken& t : spec.added) {
    if (t.content == text) return t.id;
  }
  const std::string bytes = entry_bytes(text);
  for (size_t id = 0; id < spec.vocab.size(); ++id) {
    if (spec.vocab[id] == bytes) return static_cast<int32_t>(id);
  }
  return std::nullopt;
}

// Marks `text` an added special token (the slow GPT-2 tokenizer splits them out of the text).
void add_special(BpeSpec& spec, const std::string& text) {
  std::optional<int32_t> id = id_of(spec, text);
  if (!id) return;
  for (AddedToken& t : spec.added) {
    if (t.id == *id) {
      t.special = true;
      return;
    }
  }
  spec.added.push_back({*id, text, true});
}

// tokenizer_config.json (and special_tokens_map.json): special tokens, add_bos_token, the
// JSON-escaping tokenizer class of LongCrawl64 models, and what a chat template needs.
absl::Status read_tokenizer_config(const std::string& dir, BpeSpec& spec, bool gpt2_defaults,
                                   ChatTemplateSource& chat) {
  json names = json::object();
  if (gpt2_defaults) {  // GPT2Tokenizer's own defaults
    for (const char* k : {"bos_token", "eos_token", "unk_token"}) names[k] = "<|endoftext|>";
  }
  for (const char* file : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const std::string path = absl::StrCat(dir, "/", file);
    if (!std::filesystem::exists(path)) continue;
    absl::StatusOr<json> j = read_json_object(path);
    if (!j.ok()) return j.status();
    const JsonFields f(*j, path);
    for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      if (const json* v = f.find(k)) names[k] = *v;
    }
    FPA_RETURN_IF_ERROR(f.boolean("add_bos_token", &spec.add_bos));
    FPA_RETURN_IF_ERROR(f.boolean("add_prefix_space", &spec.add_prefix_space));
    std::string cls;
    FPA_RETURN_IF_ERROR(f.string("tokenizer_class", &cls));
    if (cls == "JSONGPT2Tokenizer") spec.json_escape = true;
    if (const json* t = f.find("chat_template")) {
      chat.value = *t;
      chat.config_path = path;
    }
    if (const json* decoder = f.find("added_tokens_decoder")) {
      if (!decoder->is_object()) return refuse(path, "added_tokens_decoder", "must be an object");
      for (const auto& [id, t] : decoder->items()) {
        const std::string key = absl::StrCat("added_tokens_decoder.", id);
        int32_t n = 0;
        if (!absl::SimpleAtoi(id, &n) || n < 0) return refuse(path, key, "is not a token id");
        FPA_RETURN_IF_ERROR(read_added_token(t, key, path, n, spec));
      }
    }
  }
  auto set = [&](const char* key, std::optional<int32_t>& out) {
    if (!names.contains(key)) return;
    if (std::optional<std::string> text = token_text(names[key])) {
      add_special(spec, *text);
      out = id_of(spec, *text);
    }
  };
  auto text_of = [&](const char* key) {
    return names.contains(key) ? token_text(names[key]).value_or("") : "";
  };
  chat.bos_token = text_of("bos_token");
  chat.eos_token = text_of("eos_token");
  set("bos_token", spec.special.bos);
  set("eos_token", spec.special.eos);
  set("unk_token", spec.special.unk);
  set("pad_token", spec.special.pad);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir,
                                                          const ModelConfig& config) {
  namespace fs = std::filesystem;
  BpeSpec spec;
  ChatTemplateSource chat;
  if (fs::exists(dir + "/tokenizer.json")) {
    FPA_RETURN_IF_ERROR(read_tokenizer_json(dir + "/tokenizer.json", spec));
    FPA_RETURN_IF_ERROR(read_tokenizer_config(dir, spec, false, chat));
  } else if (fs::exists(dir + "/vocab.json") && fs::exists(dir + "/merges.txt")) {
    absl::StatusOr<json> vocab = read_json_object(dir + "/vocab.json");
    if (!vocab.ok()) return vocab.status();
    FPA_RETURN_IF_ERROR(read_vocab(*vocab, dir + "/vocab.json", spec));
    FPA_RETURN_IF_ERROR(read_merges_txt(dir + "/merges.txt", spec));
    spec.pattern = kGpt2Pattern;
    FPA_RETURN_IF_ERROR(read_tokenizer_config(dir, spec, true, chat));
  } else {
    return make_byte_tokenizer(config);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = make_bpe_tokenizer(std::move(spec));
  if (tokenizer.ok()) (*tokenizer)->set_chat_template(load_chat_template(dir, chat));
  return tokenizer;
}

}  // namespace fpa
