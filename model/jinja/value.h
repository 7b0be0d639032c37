// The values a Jinja template computes with: JSON data (nlohmann::ordered_json, so a dict keeps
// its insertion order as Python's does), plus what JSON cannot hold: undefined, a namespace
// (shared, so `set ns.x` is seen by every holder) and a callable (macro, global, bound method).
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace fpa::jinja {

using Json = nlohmann::ordered_json;

// A parse or render error. The interpreter recurses deeply, so errors unwind as this exception
// to Template's entry points, which return it as an absl::Status; it never leaves the library.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& message);

struct Value;

// A call's arguments, positional then keyword (`f(a, b=1)`).
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;

  // The argument at `index` or named `name`; nullptr when absent.
  const Value* find(size_t index, absl::string_view name) const;
  // The argument as a string, integer or truth value; `fallback` when absent or None.
  std::string string(size_t index, absl::string_view name, std::string fallback) const;
  int64_t integer(size_t index, absl::string_view name, int64_t fallback) const;
  bool flag(size_t index, absl::string_view name, bool fallback) const;
  // Fails naming `function` when there are more than `max_positional` positional arguments or
  // a keyword outside `names`.
  void check(absl::string_view function, size_t max_positional,
             std::initializer_list<absl::string_view> names) const;
};

using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kFunction };

  Kind kind = Kind::kUndefined;
  Json data;                           // kData
  std::shared_ptr<Json> ns;            // kNamespace: a JSON object
  std::shared_ptr<const Function> fn;  // kFunction
  std::string name;                    // kUndefined: what was looked up; kFunction: its name

  Value() = default;
  // Anything JSON holds is a value (implicitly, as Python's literals are).
  template <typename T>
  requires(!std::same_as<std::remove_cvref_t<T>, Value> && std::constructible_from<Json, T>)
      Value(T&& j)
      : kind(Kind::kData), data(std::forward<T>(j)) {}  // NOLINT
  static Value undefined(std::string what);
  static Value make_namespace(Json object);
  static Value function(std::string name, Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_data() const { return kind == Kind::kData; }
  bool is_string() const { return is_data() && data.is_string(); }
  // The JSON value; fails naming `what` for undefined, namespaces and callables.
  const Json& json(absl::string_view what) const;
  // The string; fails naming `what` otherwise.
  const std::string& str(absl::string_view what) const;
};

// Python's truthiness (undefined is false).
bool truthy(const Value& v);

// Python's ==, with undefined equal only to undefined.
bool equal(const Value& a, const Value& b);

// Python's type name, for errors ("str", "int", "NoneType", ...).
std::string type_name(const Value& v);

// Nesting depth of arrays and objects, stopping early once past `limit`.
int depth(const Json& j, int limit);

}  // namespace fpa::jinja
