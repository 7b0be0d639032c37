// Jinja's filters that chat templates use, with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/operators.h"
#include "model/jinja/pyformat.h"
#include "model/jinja/pystr.h"

namespace fpa::jinja {
namespace {

using Filter = Value (*)(const Value& subject, Args& args);

// The position of an argument that is passed only by name.
constexpr size_t kByName = SIZE_MAX;

Value text_filter(const Value& v, Args& args, std::string (*f)(std::string_view)) {
  args.check("filter", 0, {});
  return Json(f(py_str(v)));
}

Value trim(const Value& v, Args& args) {
  args.check("trim", 1, {"chars"});
  const Value* chars = args.find(0, "chars");
  std::optional<std::string> set;
  if (chars && !(chars->is_data() && chars->data.is_null())) set = chars->str("trim chars");
  return Json(pystr::strip(py_str(v), set, true, true));
}

Value length(const Value& v, Args& args) {
  args.check("length", 0, {});
  if (v.is_undefined()) return 0;
  const Json& j = v.json("length");
  if (j.is_string()) return pystr::length(j.get_ref<const std::string&>());
  if (j.is_array() || j.is_object()) return j.size();
  fail(absl::StrCat("object of type '", type_name(v), "' has no len()"));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent, ...).
Value tojson(const Value& v, Args& args) {
  args.check("tojson", 1, {"indent", "ensure_ascii", "separators", "sort_keys"});
  DumpOptions o;
  if (const Value* indent = args.find(0, "indent"); indent && !indent->data.is_null()) {
    o.indent = indent->is_string()
                   ? indent->data.get<std::string>()
                   : std::string(std::max<int64_t>(0, to_int(*indent, "indent")), ' ');
  }
  o.ensure_ascii = args.flag(kByName, "ensure_ascii", false);
  o.sort_keys = args.flag(kByName, "sort_keys", false);
  if (const Value* sep = args.find(kByName, "separators"); sep && !sep->data.is_null()) {
    const Json& pair = sep->json("separators");
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string()) {
      fail("tojson separators: expected two strings");
    }
    o.item_separator = pair[0].get<std::string>();
    o.key_separator = pair[1].get<std::string>();
  }
  return Json(json_dumps(v.json("tojson"), o));
}

Value string(const Value& v, Args& args) {
  args.check("string", 0, {});
  return Json(py_str(v));
}

// Python's int(str) (whitespace and underscores allowed), else float(str) truncated.
std::optional<int64_t> parse_int(std::string text) {
  text = pystr::strip(text, std::nullopt, true, true);
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  int64_t i = 0;
  if (absl::SimpleAtoi(text, &i)) return i;
  double d = 0;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d) && std::abs(d) < 9e18) {
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

Value to_int_filter(const Value& v, Args& args) {
  args.check("int", 2, {"default", "base"});
  const int64_t fallback = args.integer(0, "default", 0);
  if (!v.is_data()) return fallback;
  const Json& j = v.data;
  if (j.is_boolean()) return static_cast<int64_t>(j.get<bool>());
  if (j.is_number_integer()) return j;
  if (j.is_number_float()) {
    const double d = j.get<double>();
    return std::isfinite(d) && std::abs(d) < 9e18 ? Json(static_cast<int64_t>(d)) : Json(fallback);
  }
  if (j.is_string()) return parse_int(j.get<std::string>()).value_or(fallback);
  return fallback;
}

Value to_float(const Value& v, Args& args) {
  args.check("float", 1, {"default"});
  const Value* fallback = args.find(0, "default");
  const Value otherwise = fallback ? *fallback : Value(0.0);
  if (!v.is_data()) return otherwise;
  const Json& j = v.data;
  if (j.is_number() || j.is_boolean())
    return j.is_boolean() ? double(j.get<bool>()) : j.get<double>();
  double d = 0;
  if (j.is_string() &&
      absl::SimpleAtod(pystr::strip(j.get<std::string>(), std::nullopt, true, true), &d)) {
    return d;
  }
  return otherwise;
}

Value default_filter(const Value& v, Args& args) {
  args.check("default", 2, {"default_value", "boolean"});
  const bool use_default = args.flag(1, "boolean", false) ? !truthy(v) : v.is_undefined();
  if (!use_default) return v;
  const Value* fallback = args.find(0, "default_value");
  return fallback ? *fallback : Value(Json(""));
}

Value first(const Value& v, Args& args) {
  args.check("first", 0, {});
  const Json items = iterate(v, "first");
  return items.empty() ? Value::undefined("first item") : Value(items.front());
}

Value last(const Value& v, Args& args) {
  args.check("last", 0, {});
  const Json items = iterate(v, "last");
  return items.empty() ? Value::undefined("last item") : Value(items.back());
}

// Jinja's attribute getter: "a.b.0" looks up a, then b, then index 0, each item-first.
Value get_path(const Value& v, const std::string& path) {
  Value out = v;
  for (const std::string& part : pystr::split(path, ".", -1)) {
    int64_t index = 0;
    out = absl::SimpleAtoi(part, &index) ? subscript(out, Json(index)) : subscript(out, Json(part));
  }
  return out;
}

Value join(const Value& v, Args& args) {
  args.check("join", 2, {"d", "attribute"});
  const std::string separator = args.string(0, "d", "");
  const Value* attr = args.find(1, "attribute");
  std::vector<std::string> parts;
  size_t bytes = 0;
  for (const Json& item : iterate(v, "join")) {
    parts.push_back(py_str(attr ? get_path(item, attr->str("attribute")) : Value(item)));
    bytes += parts.back().size() + separator.size();
    if (bytes > kMaxStringBytes) fail("join: the result is too long");
  }
  return Json(absl::StrJoin(parts, separator));
}

Value items(const Value& v, Args& args) {
  args.check("items", 0, {});
  Json out = Json::array();
  if (v.is_undefined()) return out;
  const Json& j = v.kind == Value::Kind::kNamespace ? *v.ns : v.json("items");
  if (!j.is_object()) fail(absl::StrCat("items: expected a mapping, got ", type_name(v)));
  for (const auto& [key, value] : j.items()) out.push_back(Json::array({key, value}));
  return out;
}

Value list(const Value& v, Args& args) {
  args.check("list", 0, {});
  return iterate(v, "list");
}

Value map_filter(const Value& v, Args& args) {
  Json out = Json::array();
  if (const Value* attr = args.find(kByName, "attribute")) {
    args.check("map", 0, {"attribute", "default"});
    const Value* fallback = args.find(kByName, "default");
    for (const Json& item : iterate(v, "map")) {
      Value got = get_path(item, attr->str("attribute"));
      out.push_back((got.is_undefined() && fallback ? *fallback : got).json("map"));
    }
    return out;
  }
  if (args.positional.empty()) fail("map: needs a filter name or attribute=");
  const std::string name = args.positional[0].str("map filter");
  if (!has_filter(name)) fail(absl::StrCat("unsupported: filter '", name, "'"));
  Args rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.named = args.named;
  for (const Json& item : iterate(v, "map")) {
    Args each = rest;
    out.push_back(apply_filter(name, Value(item), each).json("map"));
  }
  return out;
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
// TODO(issue 24): these (and map) are eager; Python's return generators, so an error in one
// whose result is never consumed (`none|select`) does not fail there.
Value select_impl(const Value& v, Args& args, bool keep, bool by_attribute) {
  size_t at = 0;
  std::string attr;
  if (by_attribute) {
    if (args.positional.empty()) fail("selectattr: needs an attribute name");
    attr = args.positional[at++].str("attribute");
  }
  std::string test;
  if (at < args.positional.size()) test = args.positional[at++].str("test name");
  if (!test.empty() && !has_test(test)) fail(absl::StrCat("unsupported: test '", test, "'"));
  Args test_args;
  test_args.positional.assign(args.positional.begin() + at, args.positional.end());
  test_args.named = args.named;
  Json out = Json::array();
  for (const Json& item : iterate(v, "select")) {
    const Value subject = by_attribute ? get_path(item, attr) : Value(item);
    Args each = test_args;
    const bool passes = test.empty() ? truthy(subject) : apply_test(test, subject, each);
    if (passes == keep) out.push_back(item);
  }
  return out;
}

Value select(const Value& v, Args& a) { return select_impl(v, a, true, false); }
Value reject(const Value& v, Args& a) { return select_impl(v, a, false, false); }
Value selectattr(const Value& v, Args& a) { return select_impl(v, a, true, true); }
Value rejectattr(const Value& v, Args& a) { return select_impl(v, a, false, true); }

Value unique(const Value& v, Args& args) {
  args.check("unique", 2, {"case_sensitive", "attribute"});
  const bool case_sensitive = args.flag(0, "case_sensitive", false);
  const Value* attr = args.find(1, "attribute");
  Json out = Json::array();
  std::vector<Value> seen;
  for (const Json& item : iterate(v, "unique")) {
    Value key = attr ? get_path(item, attr->str("attribute")) : Value(item);
    if (!case_sensitive && key.is_string()) key = Json(pystr::lower(key.data.get<std::string>()));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); }))
      continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return out;
}

Value reverse(const Value& v, Args& args) {
  args.check("reverse", 0, {});
  if (v.is_string()) {
    std::vector<std::string_view> cs = pystr::chars(v.data.get_ref<const std::string&>());
    std::string out;
    for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
    return Json(out);
  }
  Json items = iterate(v, "reverse");
  std::reverse(items.begin(), items.end());
  return items;
}

Value replace(const Value& v, Args& args) {
  args.check("replace", 3, {"old", "new", "count"});
  return Json(pystr::replace(py_str(v), args.string(0, "old", ""), args.string(1, "new", ""),
                             args.integer(2, "count", -1), kMaxStringBytes));
}

// Jinja's indent: lines after the first (and the first when first=True) indented; blank lines
// only when blank=True.
Value indent(const Value& v, Args& args) {
  args.check("indent", 3, {"width", "first", "blank"});
  const Value* width = args.find(0, "width");
  std::string pad(4, ' ');
  if (width && width->is_string()) {
    pad = width->data.get<std::string>();
  } else if (width) {
    pad.assign(std::clamp<int64_t>(to_int(*width, "indent width"), 0, 1024), ' ');
  }
  const std::vector<std::string> lines = pystr::splitlines(py_str(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    const bool indented =
        i == 0 ? args.flag(1, "first", false) : !lines[i].empty() || args.flag(2, "blank", false);
    if (indented) out += pad;
    out += lines[i];
    if (out.size() > kMaxStringBytes) fail("indent: the result is too long");
  }
  return Json(out);
}

Value safe(const Value& v, Args& args) {
  args.check("safe", 0, {});
  return v;
}

Value escape(const Value& v, Args& args) {
  args.check("escape", 0, {});
  std::string out;
  for (char c : py_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Json(out);
}

// Jinja's title filter (not str.title): words start after whitespace, '-', '(', '{', '[', '<'.
std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool boundary = std::string_view(" \t\n\r\f\v-({[<").find(c) != std::string_view::npos;
    const std::string_view one(&c, 1);
    out += boundary ? one : word_start ? pystr::upper(one) : pystr::lower(one);
    word_start = boundary;
  }
  return out;
}

const std::map<absl::string_view, Filter>& filters() {
  static const std::map<absl::string_view, Filter> table = {
      {"trim", trim},
      {"length", length},
      {"count", length},
      {"upper", [](const Value& v, Args& a) { return text_filter(v, a, pystr::upper); }},
      {"lower", [](const Value& v, Args& a) { return text_filter(v, a, pystr::lower); }},
      {"title", [](const Value& v, Args& a) { return text_filter(v, a, jinja_title); }},
      {"capitalize", [](const Value& v, Args& a) { return text_filter(v, a, pystr::capitalize); }},
      {"tojson", tojson},
      {"string", string},
      {"int", to_int_filter},
      {"float", to_float},
      {"default", default_filter},
      {"d", default_filter},
      {"first", first},
      {"last", last},
      {"join", join},
      {"items", items},
      {"list", list},
      {"map", map_filter},
      {"select", select},
      {"reject", reject},
      {"selectattr", selectattr},
      {"rejectattr", rejectattr},
      {"unique", unique},
      {"reverse", reverse},
      {"replace", replace},
      {"indent", indent},
      {"safe", safe},
      {"e", escape},
      {"escape", escape},
  };
  return table;
}

}  // namespace

bool has_filter(absl::string_view name) { return filters().contains(name); }

Value apply_filter(absl::string_view name, const Value& subject, Args& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail(absl::StrCat("unsupported: filter '", name, "'"));
  return it->second(subject, args);
}

}  // namespace fpa::jinja
