#include "model/jinja/template.h"

#include "absl/strings/str_cat.h"
#include "model/jinja/builtins.h"
#include "model/jinja/parser.h"

namespace fpa::jinja {

absl::StatusOr<Template> Template::parse(const std::string& source) {
  try {
    return Template(std::make_shared<const Body>(jinja::parse(source)));
  } catch (const Error& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const std::exception& e) {  // a library error the code did not foresee: not a crash
    return absl::InternalError(absl::StrCat("chat template parser: ", e.what()));
  }
}

absl::StatusOr<std::string> Template::render(const nlohmann::ordered_json& context,
                                             const RenderOptions& options) const {
  if (!context.is_object()) return absl::InvalidArgumentError("the context must be an object");
  auto globals = std::make_shared<Scope>();
  for (auto& [name, value] : global_functions(options.now)) globals->vars[name] = std::move(value);
  for (const auto& [name, value] : context.items()) globals->vars[name] = Value(value);
  Interpreter interpreter(options.limits, globals);
  try {
    return interpreter.render(*body_);
  } catch (const RaisedError& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("line ", interpreter.line(), ": ", e.what()));
  } catch (const std::exception& e) {  // a library error the code did not foresee: not a crash
    return absl::InternalError(absl::StrCat("line ", interpreter.line(), ": ", e.what()));
  }
}

}  // namespace fpa::jinja
