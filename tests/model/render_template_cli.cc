// model/jinja as a filter, for tests/model/jinja_parity.mjs:
//   render_template_cli < {"template": "...", "contexts": [{...}, ...]}
//   -> {"results": [{"text": "..."} or {"error": "..."}, ...]}
// strftime_now reads the fixed date the reference renders used (2025-07-10T12:00:00Z).
#include <cstdlib>
#include <ctime>
#include <iostream>

#include "model/jinja/template.h"

int main() {
  using nlohmann::ordered_json;
  setenv("TZ", "UTC", 1);
  tzset();
  const ordered_json in = ordered_json::parse(std::cin);
  fpa::jinja::RenderOptions options;
  options.now = [] { return std::chrono::system_clock::from_time_t(1752148800); };
  const absl::StatusOr<fpa::jinja::Template> t =
      fpa::jinja::Template::parse(in["template"].get<std::string>());
  ordered_json results = ordered_json::array();
  for (const ordered_json& context : in["contexts"]) {
    absl::StatusOr<std::string> text = t.ok() ? t->render(context, options) : t.status();
    results.push_back(text.ok() ? ordered_json{{"text", *text}}
                                : ordered_json{{"error", std::string(text.status().message())}});
  }
  std::cout << ordered_json{{"results", results}}.dump(-1, ' ', false,
                                                       ordered_json::error_handler_t::replace)
            << "\n";
  return 0;
}
