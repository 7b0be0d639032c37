// Template text -> model/jinja's parser and renderer, over a chat with tool calls. Whatever the
// text, parsing and rendering end with a result or an error, inside the render bounds: no
// crash, no sanitizer report, no hang, no output past the limit.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/jinja/template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief. {{ not a tag }}"},
      {"role": "user", "content": "Weather in Paris?\n\u00e9\u4e2d\ud83d\ude00"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
        {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "hourly": false}}}]},
      {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5}"},
      {"role": "assistant", "content": [{"type": "text", "text": "21.5 C"}]},
      {"role": "user", "content": ""}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer", "enum": [1, 2]}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fpa::jinja::Template> t = fpa::jinja::Template::parse(text);
  if (!t.ok()) return 0;
  fpa::jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_steps = 200'000;
  options.limits.max_work_bytes = 64 << 20;
  options.limits.max_call_depth = 32;
  options.now = [] { return std::chrono::system_clock::from_time_t(1752148800); };
  absl::StatusOr<std::string> out = t->render(context(), options);
  if (out.ok() && out->size() > options.limits.max_output_bytes) std::abort();
  return 0;
}
