// A chat rendered by the model's own template (model/model_chat_template.h), with what
// transformers' apply_chat_template passes: messages, tools (when the request has them),
// add_generation_prompt=true, bos_token and eos_token, plus the request's
// chat_template_kwargs (as vLLM takes them, e.g. {"enable_thinking": false}).
// TODO(issue 24): the request is parsed into a sorted map, so a template sees the keys of
// messages and tools (tool call arguments printed by tojson) sorted, not in the client's order.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/model_chat_template.h"
#include "nlohmann/json.hpp"

namespace fpa::server {

// What every template relies on: a non-empty list of objects with non-empty string roles (the
// rest, such as content as text, parts or null, or tool_calls, is the template's to read).
absl::Status check_messages(const nlohmann::json& messages);

// The prompt text; InvalidArgument names the field, or carries the template's own error
// ("chat template: ...").
absl::StatusOr<std::string> render_model_template(const ModelChatTemplate& chat_template,
                                                  const nlohmann::json& body);

}  // namespace fpa::server
