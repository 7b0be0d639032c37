// vLLM's POST /tokenize and POST /detokenize, with the model's own tokenizer:
//   /tokenize {"prompt": str, "add_special_tokens": bool = true} or {"messages": [...]} (the chat
//   template's prompt) -> {"count", "max_model_len", "tokens", "token_strs": null}
//   /detokenize {"tokens": [int]} -> {"prompt": str}
#pragma once

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/request/validate.h"

namespace fpa::server {

absl::StatusOr<nlohmann::json> tokenize(const nlohmann::json& body, const RequestLimits& limits);
absl::StatusOr<nlohmann::json> detokenize(const nlohmann::json& body, const RequestLimits& limits);

}  // namespace fpa::server
