// A model's own chat template: tokenizer_config.json's "chat_template" (a string, or a list of
// {"name", "template"} of which "default" is used) or a chat_template.jinja beside it (which
// transformers prefers), parsed once when the model loads.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/jinja/template.h"
#include "nlohmann/json.hpp"

namespace fpa {

struct ModelChatTemplate {
  // An error naming the file and the problem when the template is not usable; the model still
  // loads, and chat requests report it.
  absl::StatusOr<jinja::Template> parsed;
  // The special tokens' texts, which templates read as bos_token and eos_token.
  std::string bos_token, eos_token;
};

// What tokenizer_config.json says: its "chat_template" value (null: none) and token texts.
struct ChatTemplateSource {
  nlohmann::json value;
  std::string config_path;
  std::string bos_token, eos_token;
};

// The template of model directory `dir`; null when it has none.
std::shared_ptr<const ModelChatTemplate> load_chat_template(const std::string& dir,
                                                            const ChatTemplateSource& source);

}  // namespace fpa
