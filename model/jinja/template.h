// A Jinja chat template as Hugging Face transformers renders one (apply_chat_template): a
// subset of Jinja2 with trim_blocks and lstrip_blocks, break/continue, transformers'
// {% generation %} block, and its globals raise_exception and strftime_now and tojson filter.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +); if/elif/else, for (loop.*,
// unpacking, `if` filter, else, break, continue), set (names, namespace attributes, blocks),
// macro and call blocks; Python's literals, operators, slices, `x if c else y`, and/or/not,
// in, tests; the filters in filters.cc, the tests in tests.cc, the str and dict methods in
// methods.cc, and range/namespace/dict. Anything else fails with "unsupported: <construct>".
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/jinja/interpreter.h"
#include "nlohmann/json.hpp"

namespace fpa::jinja {

struct RenderOptions {
  Limits limits;
  // strftime_now's clock (tests inject a fixed one).
  std::function<std::chrono::system_clock::time_point()> now = [] {
    return std::chrono::system_clock::now();
  };
};

class Template {
 public:
  // InvalidArgument naming the line and the construct when the source does not parse or uses
  // what is not supported.
  static absl::StatusOr<Template> parse(const std::string& source);

  // The text for `context`'s variables (messages, add_generation_prompt, bos_token, ...).
  // InvalidArgument: raise_exception's message as it is, or the line and the problem.
  absl::StatusOr<std::string> render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace fpa::jinja
