#include "model/jinja/operators.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/pyformat.h"
#include "model/jinja/pystr.h"

namespace fpa::jinja {
namespace {

bool is_int(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
bool is_num(const Json& j) { return j.is_number() || j.is_boolean(); }
int64_t int_of(const Json& j) { return j.is_boolean() ? j.get<bool>() : j.get<int64_t>(); }
double num_of(const Json& j) { return j.is_boolean() ? j.get<bool>() : j.get<double>(); }

[[noreturn]] void bad_operands(absl::string_view op, const Value& a, const Value& b) {
  fail(absl::StrCat("unsupported operand type(s) for ", op, ": '", type_name(a), "' and '",
                    type_name(b), "'"));
}

void check_size(size_t bytes) {
  if (bytes > kMaxStringBytes) fail("a string or list grows past the size limit");
}

[[noreturn]] void too_big() { fail("unsupported: integers beyond 64 bits"); }

// Python's floor division and modulo on integers.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) too_big();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t int_pow(int64_t base, int64_t exponent) {
  int64_t result = 1;
  for (int64_t i = 0; i < exponent; ++i) {
    if (result == 0 || (result == 1 && base == 1)) break;
    if (__builtin_mul_overflow(result, base, &result)) too_big();
  }
  return result;
}

Json repeat(const Json& subject, int64_t times) {
  if (times <= 0) return subject.is_string() ? Json("") : Json::array();
  const size_t unit =
      subject.is_string() ? subject.get_ref<const std::string&>().size() : subject.size();
  if (unit != 0 && static_cast<uint64_t>(times) > kMaxStringBytes / unit) check_size(SIZE_MAX);
  if (subject.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += subject.get_ref<const std::string&>();
    return out;
  }
  Json out = Json::array();
  for (int64_t i = 0; i < times; ++i) {
    for (const Json& item : subject) out.push_back(item);
  }
  return out;
}

Value arithmetic(absl::string_view op, const Value& a, const Value& b) {
  const Json& x = a.json(op);
  const Json& y = b.json(op);
  if (op == "+" && x.is_string() && y.is_string()) {
    check_size(x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size());
    return Json(x.get<std::string>() + y.get<std::string>());
  }
  if (op == "+" && x.is_array() && y.is_array()) {
    check_size(x.size() + y.size());
    Json out = x;
    for (const Json& item : y) out.push_back(item);
    return out;
  }
  if (op == "*" && (x.is_string() || x.is_array()) && is_int(y)) return repeat(x, int_of(y));
  if (op == "*" && (y.is_string() || y.is_array()) && is_int(x)) return repeat(y, int_of(x));
  if (op == "%" && x.is_string()) fail("unsupported: string formatting with %");
  if (!is_num(x) || !is_num(y)) bad_operands(op, a, b);
  if (is_int(x) && is_int(y) && op != "/") {
    const int64_t i = int_of(x), j = int_of(y);
    int64_t r = 0;
    const bool overflow = op == "+"   ? __builtin_add_overflow(i, j, &r)
                          : op == "-" ? __builtin_sub_overflow(i, j, &r)
                          : op == "*" ? __builtin_mul_overflow(i, j, &r)
                                      : false;
    if (overflow) too_big();
    if (op == "+" || op == "-" || op == "*") return r;
    if (op == "//") return floor_div(i, j);
    if (op == "%") return i - floor_div(i, j) * j;  // |floor_div(i, j) * j| <= |i|
    if (op == "**" && j >= 0) return int_pow(i, j);
  }
  const double i = num_of(x), j = num_of(y);
  if ((op == "/" || op == "//" || op == "%") && j == 0) fail("float division by zero");
  if (op == "+") return i + j;
  if (op == "-") return i - j;
  if (op == "*") return i * j;
  if (op == "/") return i / j;
  if (op == "//") return std::floor(i / j);
  if (op == "%") return i - std::floor(i / j) * j;
  if (op == "**") return std::pow(i, j);
  bad_operands(op, a, b);
}

// a < b etc. on numbers, strings or lists, as Python orders them.
bool less(const Value& a, const Value& b, absl::string_view op) {
  const Json& x = a.json(op);
  const Json& y = b.json(op);
  if (is_num(x) && is_num(y)) {
    if (is_int(x) && is_int(y)) return int_of(x) < int_of(y);
    return num_of(x) < num_of(y);
  }
  if (x.is_string() && y.is_string())
    return x.get_ref<const std::string&>() < y.get_ref<const std::string&>();
  fail(absl::StrCat("'", op, "' not supported between instances of '", type_name(a), "' and '",
                    type_name(b), "'"));
}

// Python's slice.indices: the positions start, start + step, ... before stop.
std::vector<size_t> slice_positions(size_t size, const Value& start, const Value& stop,
                                    const Value& step) {
  const int64_t n = static_cast<int64_t>(size);
  const int64_t s = step.is_undefined() || step.data.is_null() ? 1 : to_int(step, "slice step");
  if (s == 0) fail("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t absent) {
    if (v.is_undefined() || v.data.is_null()) return absent;
    int64_t i = to_int(v, "slice index");
    if (i < 0) i = std::max<int64_t>(i + n, s < 0 ? -1 : 0);
    return std::min(i, s < 0 ? n - 1 : n);
  };
  const int64_t from = bound(start, s < 0 ? n - 1 : 0);
  const int64_t to = bound(stop, s < 0 ? -1 : n);
  std::vector<size_t> out;
  for (int64_t i = from; s > 0 ? i < to : i > to; i += s) out.push_back(static_cast<size_t>(i));
  return out;
}

}  // namespace

int64_t to_int(const Value& v, absl::string_view what) {
  const Json& j = v.json(what);
  if (!is_int(j)) fail(absl::StrCat(what, ": expected an integer, got ", type_name(v)));
  return int_of(j);
}

Value binary_op(absl::string_view op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "<") return less(a, b, op);
  if (op == ">") return less(b, a, op);
  if (op == "<=") return !less(b, a, op);
  if (op == ">=") return !less(a, b, op);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  if (op == "~") {
    std::string s = py_str(a);
    const std::string t = py_str(b);
    check_size(s.size() + t.size());
    return Json(s + t);
  }
  return arithmetic(op, a, b);
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  const Json& c = container.json("in");
  if (c.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires a string as left operand");
    return c.get_ref<const std::string&>().find(item.data.get_ref<const std::string&>()) !=
           std::string::npos;
  }
  if (c.is_object()) return item.is_string() && c.contains(item.data.get<std::string>());
  if (!c.is_array())
    fail(absl::StrCat("argument of type '", type_name(container), "' is not iterable"));
  for (const Json& element : c) {
    if (equal(Value(element), item)) return true;
  }
  return false;
}

Value attribute(const Value& subject, const std::string& name) {
  switch (subject.kind) {
    case Value::Kind::kUndefined:
      fail(absl::StrCat("'", subject.name, "' is undefined (reading its '", name, "')"));
    case Value::Kind::kNamespace: {
      auto it = subject.ns->find(name);
      return it == subject.ns->end() ? Value::undefined(name) : Value(*it);
    }
    case Value::Kind::kFunction:
      return Value::undefined(name);
    case Value::Kind::kData:
      break;
  }
  if (Value m = method(subject, name); !m.is_undefined()) return m;
  if (subject.data.is_object()) {
    auto it = subject.data.find(name);
    if (it != subject.data.end()) return Value(*it);
  }
  return Value::undefined(name);
}

Value subscript(const Value& subject, const Value& key) {
  if (subject.is_undefined()) {
    fail(absl::StrCat("'", subject.name, "' is undefined (reading an item)"));
  }
  if (subject.kind == Value::Kind::kNamespace && key.is_string())
    return attribute(subject, key.data);
  if (!subject.is_data()) return Value::undefined("item");
  const Json& s = subject.data;
  if (key.is_string()) {
    const std::string& k = key.data.get_ref<const std::string&>();
    if (s.is_object()) {
      auto it = s.find(k);
      if (it != s.end()) return Value(*it);
    }
    if (Value m = method(subject, k); !m.is_undefined()) return m;
    return Value::undefined(k);
  }
  if (!key.is_data() || !is_int(key.data) || !(s.is_array() || s.is_string())) {
    return Value::undefined("item");
  }
  int64_t i = int_of(key.data);
  if (s.is_array()) {
    const int64_t n = static_cast<int64_t>(s.size());
    if (i < 0) i += n;
    return i < 0 || i >= n ? Value::undefined(absl::StrCat("index ", i)) : Value(s[i]);
  }
  const std::vector<std::string_view> cs = pystr::chars(s.get_ref<const std::string&>());
  const int64_t n = static_cast<int64_t>(cs.size());
  if (i < 0) i += n;
  return i < 0 || i >= n ? Value::undefined(absl::StrCat("index ", i)) : Value(std::string(cs[i]));
}

Value slice(const Value& subject, const Value& start, const Value& stop, const Value& step) {
  const Json& s = subject.json("slice");
  if (s.is_array()) {
    Json out = Json::array();
    for (size_t i : slice_positions(s.size(), start, stop, step)) out.push_back(s[i]);
    return out;
  }
  if (!s.is_string()) fail(absl::StrCat("'", type_name(subject), "' object is not sliceable"));
  const std::vector<std::string_view> cs = pystr::chars(s.get_ref<const std::string&>());
  std::string out;
  for (size_t i : slice_positions(cs.size(), start, stop, step)) out += cs[i];
  return Json(out);
}

Json iterate(const Value& v, absl::string_view what) {
  if (v.is_undefined()) return Json::array();
  const Json& j = v.json(what);
  if (j.is_array()) return j;
  Json out = Json::array();
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) out.push_back(key);
  } else if (j.is_string()) {
    for (std::string_view c : pystr::chars(j.get_ref<const std::string&>()))
      out.push_back(std::string(c));
  } else {
    fail(absl::StrCat(what, ": '", type_name(v), "' object is not iterable"));
  }
  return out;
}

}  // namespace fpa::jinja
