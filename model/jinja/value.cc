#include "model/jinja/value.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fpa::jinja {

void fail(const std::string& message) { throw Error(message); }

const Value* Args::find(size_t index, absl::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : named) {
    if (key == name) return &value;
  }
  return nullptr;
}

namespace {

bool absent(const Value* v) { return v == nullptr || (v->is_data() && v->data.is_null()); }

}  // namespace

std::string Args::string(size_t index, absl::string_view name, std::string fallback) const {
  const Value* v = find(index, name);
  return absent(v) ? fallback : v->str(name);
}

int64_t Args::integer(size_t index, absl::string_view name, int64_t fallback) const {
  const Value* v = find(index, name);
  if (absent(v)) return fallback;
  const Json& j = v->json(name);
  if (j.is_boolean()) return j.get<bool>();
  if (!j.is_number_integer())
    fail(absl::StrCat(name, ": expected an integer, got ", type_name(*v)));
  return j.get<int64_t>();
}

bool Args::flag(size_t index, absl::string_view name, bool fallback) const {
  const Value* v = find(index, name);
  return v == nullptr ? fallback : truthy(*v);
}

void Args::check(absl::string_view function, size_t max_positional,
                 std::initializer_list<absl::string_view> names) const {
  if (positional.size() > max_positional) {
    fail(absl::StrCat(function, "() takes at most ", max_positional, " positional arguments (",
                      positional.size(), " given)"));
  }
  for (const auto& [key, value] : named) {
    if (std::find(names.begin(), names.end(), key) == names.end()) {
      fail(absl::StrCat(function, "() got an unexpected keyword argument '", key, "'"));
    }
  }
}

Value Value::undefined(std::string what) {
  Value v;
  v.name = std::move(what);
  return v;
}

Value Value::make_namespace(Json object) {
  Value v;
  v.kind = Kind::kNamespace;
  v.ns = std::make_shared<Json>(std::move(object));
  return v;
}

Value Value::function(std::string name, Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.name = std::move(name);
  v.fn = std::make_shared<const Function>(std::move(f));
  return v;
}

const Json& Value::json(absl::string_view what) const {
  switch (kind) {
    case Kind::kData:
      return data;
    case Kind::kUndefined:
      fail(absl::StrCat(what, ": '", name, "' is undefined"));
    case Kind::kNamespace:
      fail(absl::StrCat(what, ": a namespace is not a value here"));
    case Kind::kFunction:
      fail(absl::StrCat(what, ": function '", name, "' is not a value here"));
  }
  fail("unreachable");
}

const std::string& Value::str(absl::string_view what) const {
  const Json& j = json(what);
  if (!j.is_string()) fail(absl::StrCat(what, ": expected a string, got ", type_name(*this)));
  return j.get_ref<const std::string&>();
}

bool truthy(const Value& v) {
  if (v.kind != Value::Kind::kData) return v.kind != Value::Kind::kUndefined;
  const Json& j = v.data;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    default:
      return !j.empty();
  }
}

namespace {

bool is_number(const Json& j) { return j.is_number() || j.is_boolean(); }

double number(const Json& j) { return j.is_boolean() ? j.get<bool>() : j.get<double>(); }

// Python's ==: numbers (and bools) by value, dicts regardless of key order.
bool json_equal(const Json& a, const Json& b) {
  if (is_number(a) && is_number(b)) {
    if (a.is_number_integer() && b.is_number_integer()) return a.get<int64_t>() == b.get<int64_t>();
    return number(a) == number(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!json_equal(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, value] : a.items()) {
      auto it = b.find(key);
      if (it == b.end() || !json_equal(value, *it)) return false;
    }
    return true;
  }
  return a == b;
}

}  // namespace

bool equal(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
      return true;
    case Value::Kind::kData:
      return json_equal(a.data, b.data);
    case Value::Kind::kNamespace:
      return a.ns == b.ns;
    case Value::Kind::kFunction:
      return a.fn == b.fn;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
    case Value::Kind::kData:
      break;
  }
  switch (v.data.type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "int";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    default:
      return "value";
  }
}

int depth(const Json& j, int limit) {
  if (!j.is_structured()) return 0;
  int deepest = 0;
  for (const Json& child : j) {
    if (deepest >= limit) break;
    deepest = std::max(deepest, depth(child, limit - 1));
  }
  return deepest + 1;
}

}  // namespace fpa::jinja
