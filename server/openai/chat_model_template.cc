#include "server/openai/chat_model_template.h"

#include "absl/strings/str_cat.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;
using nlohmann::ordered_json;

absl::Status bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

ordered_json ordered(const json& j) { return ordered_json::parse(j.dump()); }

}  // namespace

absl::Status check_messages(const json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return bad("messages", "must be a non-empty array of messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!messages[i].is_object()) return bad(field, "must be an object");
    const json role = messages[i].value("role", json());
    if (!role.is_string() || role.get<std::string>().empty()) {
      return bad(field + ".role", "must be a non-empty string");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> render_model_template(const ModelChatTemplate& chat_template,
                                                  const json& body) {
  if (!chat_template.parsed.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the model's chat template cannot be used: ",
                                                      chat_template.parsed.status().message()));
  }
  const json& messages = body["messages"];
  if (absl::Status s = check_messages(messages); !s.ok()) return s;
  ordered_json context = ordered_json::object();
  if (const json kwargs = body.value("chat_template_kwargs", json()); !kwargs.is_null()) {
    if (!kwargs.is_object()) return bad("chat_template_kwargs", "must be an object");
    context = ordered(kwargs);
  }
  context["messages"] = ordered(messages);
  if (const json tools = body.value("tools", json()); !tools.is_null()) {
    if (!tools.is_array()) return bad("tools", "must be an array of tools");
    context["tools"] = ordered(tools);
  }
  context["add_generation_prompt"] = true;
  context["bos_token"] = chat_template.bos_token;
  context["eos_token"] = chat_template.eos_token;
  absl::StatusOr<std::string> text = chat_template.parsed->render(context);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", text.status().message()));
  }
  return text;
}

}  // namespace fpa::server
