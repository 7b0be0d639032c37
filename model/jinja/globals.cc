// The global functions: Jinja's range, namespace and dict, and transformers' raise_exception
// and strftime_now.
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/operators.h"

namespace fpa::jinja {
namespace {

Value range(Args& args) {
  args.check("range", 3, {});
  std::vector<int64_t> a;
  for (const Value& v : args.positional) a.push_back(to_int(v, "range"));
  if (a.empty()) fail("range expected at least 1 argument");
  const int64_t start = a.size() > 1 ? a[0] : 0;
  const int64_t stop = a.size() > 1 ? a[1] : a[0];
  const int64_t step = a.size() > 2 ? a[2] : 1;
  if (step == 0) fail("range() arg 3 must not be zero");
  Json out = Json::array();
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) fail("range: too many items");
    out.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return out;
}

// dict(mapping, **kwargs), as namespace() and dict() take their contents.
Json mapping(const Args& args, absl::string_view function) {
  if (args.positional.size() > 1)
    fail(absl::StrCat(function, "() takes at most 1 positional argument"));
  Json out = Json::object();
  if (!args.positional.empty()) {
    const Json& m = args.positional[0].json(function);
    if (!m.is_object()) fail(absl::StrCat(function, "(): expected a mapping"));
    out = m;
  }
  for (const auto& [key, value] : args.named)
    out[key] = value.json(absl::StrCat(function, "(", key, "=)"));
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Value>> global_functions(
    std::function<std::chrono::system_clock::time_point()> now) {
  std::vector<std::pair<std::string, Value>> out;
  out.emplace_back("range", Value::function("range", range));
  out.emplace_back("namespace", Value::function("namespace", [](Args& args) {
                     return Value::make_namespace(mapping(args, "namespace"));
                   }));
  out.emplace_back(
      "dict", Value::function("dict", [](Args& args) { return Value(mapping(args, "dict")); }));
  out.emplace_back("raise_exception", Value::function("raise_exception", [](Args& args) -> Value {
                     args.check("raise_exception", 1, {});
                     throw RaisedError(args.string(0, "message", "raise_exception() called"));
                   }));
  // Python's datetime.now().strftime(format): local time.
  out.emplace_back("strftime_now", Value::function("strftime_now", [now](Args& args) {
                     args.check("strftime_now", 1, {});
                     const std::string format = args.string(0, "format", "");
                     const std::time_t t = std::chrono::system_clock::to_time_t(now());
                     std::tm tm{};
                     localtime_r(&t, &tm);
                     char buf[1024];
                     const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
                     if (n == 0 && !format.empty()) fail("strftime_now: the format is too long");
                     return Value(Json(std::string(buf, n)));
                   }));
  return out;
}

}  // namespace fpa::jinja
