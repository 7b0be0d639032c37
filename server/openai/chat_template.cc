#include "server/openai/chat_template.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/openai/chat_model_template.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;

absl::Status bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// null (OpenAI's content of an assistant turn that only called tools) is empty text, as vLLM
// reads it; so is a missing content.
absl::StatusOr<std::string> content_of(const json& content, const std::string& field) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad(field, "must be a string, null or an array of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return bad(field, "only parts {\"type\": \"text\", \"text\": ...} are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// The default template, ChatML.
absl::StatusOr<std::string> render_chatml(const json& messages) {
  if (absl::Status s = check_messages(messages); !s.ok()) return s;
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    absl::StatusOr<std::string> content =
        content_of(m.value("content", json("")), field + ".content");
    if (!content.ok()) return content.status();
    absl::StrAppend(&prompt, "<|im_start|>", m["role"].get<std::string>(), "\n", *content,
                    kChatEndOfTurn, "\n");
  }
  return prompt + "<|im_start|>assistant\n";
}

}  // namespace

absl::StatusOr<ChatPrompt> render_chat(const json& body, const Tokenizer& tokenizer) {
  if (!body.is_object()) return bad("body", "must be a JSON object");
  if (!body.contains("messages")) return bad("messages", "is required");
  const ModelChatTemplate* own = tokenizer.chat_template();
  absl::StatusOr<std::string> text =
      own ? render_model_template(*own, body) : render_chatml(body["messages"]);
  if (!text.ok()) return text.status();
  return ChatPrompt{std::move(*text), own != nullptr};
}

absl::StatusOr<json> chat_to_completion(const json& body, const Tokenizer& tokenizer) {
  absl::StatusOr<ChatPrompt> prompt = render_chat(body, tokenizer);
  if (!prompt.ok()) return prompt.status();
  json out = body;
  out.erase("messages");
  if (out.contains("prompt")) return bad("prompt", "is not a chat field (use messages)");
  if (prompt->own_template) {  // the fields the template consumed
    out.erase("tools");
    out.erase("chat_template_kwargs");
  }
  out["prompt"] =
      prompt->own_template ? json(encode_without_bos(prompt->text, tokenizer)) : json(prompt->text);
  if (json m = body.value("max_completion_tokens", json()); !m.is_null()) {
    out.erase("max_completion_tokens");
    out["max_tokens"] = m;
  }
  json stop = body.value("stop", json());
  if (stop.is_null()) stop = json::array();
  if (stop.is_string()) stop = json::array({stop});
  if (stop.is_array() && !prompt->own_template) stop.push_back(kChatEndOfTurn);
  out["stop"] = stop;  // a wrong type stays wrong, for the completion's check to name it
  // Chat's logprobs is a boolean and top_logprobs the alternatives; completions' logprobs is both.
  if (json t = body.value("top_logprobs", json()); !t.is_null()) {
    out.erase("top_logprobs");
    if (!t.is_number_integer()) return bad("top_logprobs", "must be an integer");
    if (body.value("logprobs", json()) != true && t != 0) {
      return bad("top_logprobs", "needs logprobs: true");
    }
    if (body.value("logprobs", json()) == true) out["logprobs"] = t;
  }
  // vLLM's chat echo repeats the last message: not done here.
  if (body.value("echo", json()) == true) return bad("echo", "is not supported for chat");
  return out;
}

}  // namespace fpa::server
