// POST /v1/chat/completions as a completion: the messages rendered into a prompt by the model's
// chat template, and the chat-only fields mapped onto the completion's.
//
// A model with its own template (tokenizer_config.json's chat_template, see
// server/openai/chat_model_template.h) gets it rendered; the prompt is then encoded without the BOS
// the tokenizer adds (the template writes its own special tokens, as transformers and vLLM
// encode chats), and generation stops at the model's EOS.
// The default template (models without their own, such as the shipped byte-level ones) is
// ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n";
// generation stops at "<|im_end|>".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace fpa::server {

inline constexpr const char* kChatEndOfTurn = "<|im_end|>";

struct ChatPrompt {
  std::string text;
  bool own_template = false;  // rendered by the model's template, not the default
};

// The prompt of a chat body's "messages" (OpenAI's: [{"role", "content"}]; for the default
// template content is a string or an array of {"type": "text", "text"} parts). InvalidArgument
// names the message and field.
absl::StatusOr<ChatPrompt> render_chat(const nlohmann::json& body, const Tokenizer& tokenizer);

// The completion body equivalent to a chat body: "prompt" from "messages" (token ids with the
// model's own template), max_completion_tokens as max_tokens, the default template's
// end-of-turn marker added to "stop", "logprobs": true read as 0 alternatives.
absl::StatusOr<nlohmann::json> chat_to_completion(const nlohmann::json& body,
                                                  const Tokenizer& tokenizer);

}  // namespace fpa::server
