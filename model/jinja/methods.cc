// The Python str and dict methods templates call (`message.content.strip()`, `d.items()`).
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/operators.h"
#include "model/jinja/pyformat.h"
#include "model/jinja/pystr.h"

namespace fpa::jinja {
namespace {

using Method = Value (*)(const Json& self, Args& args);

std::optional<std::string> optional_string(const Args& args, size_t i, absl::string_view name) {
  const Value* v = args.find(i, name);
  if (v == nullptr || (v->is_data() && v->data.is_null())) return std::nullopt;
  return v->str(name);
}

const std::string& text(const Json& self) { return self.get_ref<const std::string&>(); }

Value strip(const Json& self, Args& args, bool left, bool right) {
  args.check("strip", 1, {"chars"});
  return Json(pystr::strip(text(self), optional_string(args, 0, "chars"), left, right));
}

Value split(const Json& self, Args& args) {
  args.check("split", 2, {"sep", "maxsplit"});
  return Json(
      pystr::split(text(self), optional_string(args, 0, "sep"), args.integer(1, "maxsplit", -1)));
}

// startswith/endswith: a string or a tuple (list) of strings.
Value affix(const Json& self, Args& args, bool prefix) {
  args.check(prefix ? "startswith" : "endswith", 1, {});
  if (args.positional.empty()) fail("startswith/endswith: needs an argument");
  const Json& wanted = args.positional[0].json("startswith/endswith");
  const Json options = wanted.is_array() ? wanted : Json::array({wanted});
  for (const Json& option : options) {
    if (!option.is_string()) fail("startswith/endswith: expected strings");
    const std::string& o = option.get_ref<const std::string&>();
    if (prefix ? text(self).starts_with(o) : text(self).ends_with(o)) return true;
  }
  return false;
}

Value find(const Json& self, Args& args) {
  args.check("find", 1, {});
  const size_t at = text(self).find(args.string(0, "sub", ""));
  return at == std::string::npos ? -1
                                 : static_cast<int64_t>(pystr::length(text(self).substr(0, at)));
}

Value count(const Json& self, Args& args) {
  args.check("count", 1, {});
  const std::string sub = args.string(0, "sub", "");
  if (sub.empty()) return pystr::length(text(self)) + 1;
  int64_t n = 0;
  for (size_t at = text(self).find(sub); at != std::string::npos;
       at = text(self).find(sub, at + sub.size()))
    ++n;
  return n;
}

Value join(const Json& self, Args& args) {
  args.check("join", 1, {});
  if (args.positional.empty()) fail("join: needs an argument");
  std::vector<std::string> parts;
  size_t bytes = 0;
  for (const Json& item : iterate(args.positional[0], "join")) {
    if (!item.is_string()) fail("join: expected strings");
    parts.push_back(item.get<std::string>());
    bytes += parts.back().size() + text(self).size();
    if (bytes > kMaxStringBytes) fail("join: the result is too long");
  }
  return Json(absl::StrJoin(parts, text(self)));
}

Value text_method(const Json& self, Args& args, std::string (*f)(std::string_view)) {
  args.check("method", 0, {});
  return Json(f(text(self)));
}

const std::map<absl::string_view, Method>& string_methods() {
  static const std::map<absl::string_view, Method> table = {
      {"strip", [](const Json& s, Args& a) { return strip(s, a, true, true); }},
      {"lstrip", [](const Json& s, Args& a) { return strip(s, a, true, false); }},
      {"rstrip", [](const Json& s, Args& a) { return strip(s, a, false, true); }},
      {"split", split},
      {"splitlines",
       [](const Json& s, Args& a) {
         a.check("splitlines", 0, {});
         return Value(Json(pystr::splitlines(text(s))));
       }},
      {"startswith", [](const Json& s, Args& a) { return affix(s, a, true); }},
      {"endswith", [](const Json& s, Args& a) { return affix(s, a, false); }},
      {"upper", [](const Json& s, Args& a) { return text_method(s, a, pystr::upper); }},
      {"lower", [](const Json& s, Args& a) { return text_method(s, a, pystr::lower); }},
      {"title", [](const Json& s, Args& a) { return text_method(s, a, pystr::title); }},
      {"capitalize", [](const Json& s, Args& a) { return text_method(s, a, pystr::capitalize); }},
      {"replace",
       [](const Json& s, Args& a) {
         a.check("replace", 3, {});
         return Value(Json(pystr::replace(text(s), a.string(0, "old", ""), a.string(1, "new", ""),
                                          a.integer(2, "count", -1), kMaxStringBytes)));
       }},
      {"find", find},
      {"count", count},
      {"join", join},
  };
  return table;
}

const std::map<absl::string_view, Method>& dict_methods() {
  static const std::map<absl::string_view, Method> table = {
      {"items",
       [](const Json& d, Args& a) {
         a.check("items", 0, {});
         Json out = Json::array();
         for (const auto& [key, value] : d.items()) out.push_back(Json::array({key, value}));
         return Value(out);
       }},
      {"keys",
       [](const Json& d, Args& a) {
         a.check("keys", 0, {});
         Json out = Json::array();
         for (const auto& [key, value] : d.items()) out.push_back(key);
         return Value(out);
       }},
      {"values",
       [](const Json& d, Args& a) {
         a.check("values", 0, {});
         Json out = Json::array();
         for (const auto& [key, value] : d.items()) out.push_back(value);
         return Value(out);
       }},
      {"get",
       [](const Json& d, Args& a) {
         a.check("get", 2, {});
         if (a.positional.empty()) fail("get: needs a key");
         const Value* fallback = a.find(1, "default");
         if (a.positional[0].is_string()) {
           auto it = d.find(a.positional[0].data.get<std::string>());
           if (it != d.end()) return Value(*it);
         }
         return fallback ? *fallback : Value(nullptr);
       }},
  };
  return table;
}

// Methods that modify their object: Hugging Face renders templates in an immutable sandbox.
constexpr absl::string_view kMutating[] = {"append",  "extend", "insert", "pop",
                                           "remove",  "clear",  "update", "setdefault",
                                           "popitem", "sort",   "reverse"};

}  // namespace

Value method(const Value& receiver, absl::string_view name) {
  if (!receiver.is_data()) return Value::undefined(std::string(name));
  const Json& self = receiver.data;
  const auto* table = self.is_string()   ? &string_methods()
                      : self.is_object() ? &dict_methods()
                                         : nullptr;
  if (table) {
    if (auto it = table->find(name); it != table->end()) {
      return Value::function(std::string(name),
                             [self, f = it->second](Args& args) { return f(self, args); });
    }
  }
  if (self.is_structured()) {
    for (absl::string_view m : kMutating) {
      if (name == m) {
        return Value::function(std::string(name), [name = std::string(name)](Args&) -> Value {
          fail(absl::StrCat("unsupported: ", name, "() (chat templates may not modify values)"));
        });
      }
    }
  }
  return Value::undefined(std::string(name));
}

}  // namespace fpa::jinja
