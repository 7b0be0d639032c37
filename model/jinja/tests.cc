// Jinja's tests (`x is name`).
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/operators.h"
#include "model/jinja/pystr.h"

namespace fpa::jinja {
namespace {

using Test = bool (*)(const Value& subject, Args& args);

bool data_is(const Value& v, bool (Json::*check)() const noexcept) {
  return v.is_data() && (v.data.*check)();
}

// The one argument of a comparing test.
const Value& other(Args& args, absl::string_view test) {
  args.check(test, 1, {});
  if (args.positional.empty()) fail(absl::StrCat("test '", test, "' needs an argument"));
  return args.positional[0];
}

bool compare(const Value& v, Args& args, absl::string_view op) {
  return truthy(binary_op(op, v, other(args, op)));
}

const std::map<absl::string_view, Test>& tests() {
  static const std::map<absl::string_view, Test> table = {
      {"defined", [](const Value& v, Args&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, Args&) { return v.is_undefined(); }},
      {"none", [](const Value& v, Args&) { return data_is(v, &Json::is_null); }},
      {"string", [](const Value& v, Args&) { return data_is(v, &Json::is_string); }},
      {"number",
       [](const Value& v, Args&) {
         return data_is(v, &Json::is_number) || data_is(v, &Json::is_boolean);
       }},
      {"integer", [](const Value& v, Args&) { return data_is(v, &Json::is_number_integer); }},
      {"float", [](const Value& v, Args&) { return data_is(v, &Json::is_number_float); }},
      {"boolean", [](const Value& v, Args&) { return data_is(v, &Json::is_boolean); }},
      {"true", [](const Value& v, Args&) { return v.is_data() && v.data == true; }},
      {"false", [](const Value& v, Args&) { return v.is_data() && v.data == false; }},
      {"mapping", [](const Value& v, Args&) { return data_is(v, &Json::is_object); }},
      // Jinja's: whatever iter() accepts (undefined iterates as empty).
      {"iterable",
       [](const Value& v, Args&) {
         return v.is_undefined() || data_is(v, &Json::is_string) ||
                data_is(v, &Json::is_structured);
       }},
      {"sequence",
       [](const Value& v, Args&) {
         return data_is(v, &Json::is_string) || data_is(v, &Json::is_structured);
       }},
      {"callable", [](const Value& v, Args&) { return v.kind == Value::Kind::kFunction; }},
      {"equalto", [](const Value& v, Args& a) { return compare(v, a, "=="); }},
      {"eq", [](const Value& v, Args& a) { return compare(v, a, "=="); }},
      {"==", [](const Value& v, Args& a) { return compare(v, a, "=="); }},
      {"ne", [](const Value& v, Args& a) { return compare(v, a, "!="); }},
      {"!=", [](const Value& v, Args& a) { return compare(v, a, "!="); }},
      {"lt", [](const Value& v, Args& a) { return compare(v, a, "<"); }},
      {"le", [](const Value& v, Args& a) { return compare(v, a, "<="); }},
      {"gt", [](const Value& v, Args& a) { return compare(v, a, ">"); }},
      {"ge", [](const Value& v, Args& a) { return compare(v, a, ">="); }},
      {"in", [](const Value& v, Args& a) { return contains(other(a, "in"), v); }},
      {"sameas",
       [](const Value& v, Args& a) {
         const Value& o = other(a, "sameas");
         return equal(v, o) && type_name(v) == type_name(o);
       }},
      {"odd", [](const Value& v, Args&) { return to_int(v, "odd") % 2 != 0; }},
      {"even", [](const Value& v, Args&) { return to_int(v, "even") % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, Args& a) {
         const int64_t n = to_int(other(a, "divisibleby"), "divisibleby");
         if (n == 0) fail("divisibleby 0");
         return to_int(v, "divisibleby") % n == 0;
       }},
      {"lower",
       [](const Value& v, Args&) {
         return v.is_string() &&
                pystr::lower(v.data.get<std::string>()) == v.data.get<std::string>();
       }},
      {"upper",
       [](const Value& v, Args&) {
         return v.is_string() &&
                pystr::upper(v.data.get<std::string>()) == v.data.get<std::string>();
       }},
  };
  return table;
}

}  // namespace

bool has_test(absl::string_view name) { return tests().contains(name); }

bool apply_test(absl::string_view name, const Value& subject, Args& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail(absl::StrCat("unsupported: test '", name, "'"));
  return it->second(subject, args);
}

}  // namespace fpa::jinja
