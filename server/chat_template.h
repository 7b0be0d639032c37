// POST /v1/chat/completions as a completion: the messages rendered into a prompt by the default
// chat template, and the chat-only fields mapped onto the completion's.
//
// The default template (models without their own, such as the shipped byte-level ones) is
// ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n";
// generation stops at "<|im_end|>".
// TODO(issue 24): render a model's own Jinja chat_template (tokenizer_config.json); until then
// every model gets the default.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fpa::server {

inline constexpr const char* kChatEndOfTurn = "<|im_end|>";

// The prompt of `messages` (OpenAI's: [{"role", "content"}], content a string or an array of
// {"type": "text", "text"} parts). InvalidArgument names the message and field.
absl::StatusOr<std::string> render_chat(const nlohmann::json& messages);

// The completion body equivalent to a chat body: "prompt" from "messages", max_completion_tokens
// as max_tokens, the end-of-turn marker added to "stop", "logprobs": true read as 0 alternatives.
absl::StatusOr<nlohmann::json> chat_to_completion(const nlohmann::json& body);

}  // namespace fpa::server
