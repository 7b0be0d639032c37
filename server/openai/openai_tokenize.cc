#include "server/openai/openai_tokenize.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/tokenizer.h"
#include "server/openai/chat_template.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;

absl::Status bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

absl::StatusOr<json> tokenize(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) return bad("body", "must be a JSON object");
  std::string text;
  bool own_template = false;  // writes its own special tokens
  if (body.contains("messages")) {
    absl::StatusOr<ChatPrompt> prompt = render_chat(body, *limits.tokenizer);
    if (!prompt.ok()) return prompt.status();
    text = std::move(prompt->text);
    own_template = prompt->own_template;
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    text = body["prompt"].get<std::string>();
  } else {
    return bad("prompt", "must be a string (or give messages)");
  }
  const json add = body.value("add_special_tokens", json(true));
  if (!add.is_boolean()) return bad("add_special_tokens", "must be a boolean");
  const std::vector<int32_t> ids = add.get<bool>() && !own_template
                                       ? limits.tokenizer->encode(text)
                                       : encode_without_bos(text, *limits.tokenizer);
  return json{{"count", ids.size()},
              {"max_model_len", limits.max_prompt_tokens},
              {"tokens", ids},
              {"token_strs", nullptr}};
}

absl::StatusOr<json> detokenize(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) return bad("body", "must be a JSON object");
  const json tokens = body.value("tokens", json());
  if (!tokens.is_array()) return bad("tokens", "must be an array of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const json& id = tokens[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= limits.vocab_size) {
      return bad("tokens",
                 absl::StrCat("index ", i, " is not an id in [0, ", limits.vocab_size, ")"));
    }
    ids.push_back(id.get<int32_t>());
  }
  return json{{"prompt", limits.tokenizer->decode(ids)}};
}

}  // namespace fpa::server
