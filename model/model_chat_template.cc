#include "model/model_chat_template.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "model/json_fields.h"

namespace fpa {
namespace {

// The template text in tokenizer_config.json's value: a string, or the "default" entry of a
// list of named templates.
absl::StatusOr<std::string> template_text(const nlohmann::json& value, const std::string& path) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const nlohmann::json& entry : value) {
      if (entry.is_object() && entry.value("name", nlohmann::json()) == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": 'chat_template' lists no {\"name\": \"default\", \"template\"}"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": 'chat_template' must be a string or a list of named templates"));
}

}  // namespace

std::shared_ptr<const ModelChatTemplate> load_chat_template(const std::string& dir,
                                                            const ChatTemplateSource& source) {
  const std::string jinja_path = dir + "/chat_template.jinja";
  std::string path = jinja_path;
  absl::StatusOr<std::string> text;
  if (std::filesystem::exists(jinja_path)) {
    text = read_text_file(jinja_path);
  } else if (!source.value.is_null()) {
    path = source.config_path;
    text = template_text(source.value, path);
  } else {
    return nullptr;
  }
  auto out = std::make_shared<ModelChatTemplate>();
  out->bos_token = source.bos_token;
  out->eos_token = source.eos_token;
  if (!text.ok()) {
    out->parsed = text.status();
    return out;
  }
  absl::StatusOr<jinja::Template> parsed = jinja::Template::parse(*text);
  out->parsed = parsed.ok() ? std::move(parsed)
                            : absl::InvalidArgumentError(absl::StrCat(
                                  path, ": chat template: ", parsed.status().message()));
  return out;
}

}  // namespace fpa
