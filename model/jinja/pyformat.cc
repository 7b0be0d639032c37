#include "model/jinja/pyformat.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/jinja/pystr.h"
#include "model/utf8.h"

namespace fpa::jinja {
namespace {

// Printing recurses per level; values built by templates are checked against this depth.
constexpr int kMaxPrintDepth = 128;

void check_depth(int level) {
  if (level > kMaxPrintDepth) fail("a value nests too deeply to print");
}

std::string hex_escape(const char* format, unsigned value) {
  char buf[16];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (std::string_view c : pystr::chars(s)) {
    const unsigned char b = c[0];
    if (c.size() == 1) {
      if (b == '\\' || b == static_cast<unsigned char>(quote)) {
        out += '\\';
        out += c;
      } else if (b == '\n') {
        out += "\\n";
      } else if (b == '\r') {
        out += "\\r";
      } else if (b == '\t') {
        out += "\\t";
      } else if (b < 0x20 || b >= 0x7F) {
        out += hex_escape("\\x%02x", b);
      } else {
        out += c;
      }
    } else if (utf8::decode_one(c).valid && utf8::code_point(c) < 0xA0) {
      out += hex_escape("\\x%02x", static_cast<unsigned>(utf8::code_point(c)));
    } else {
      out += c;
    }
  }
  return out + quote;
}

void repr_into(const Json& j, std::string& out, int level) {
  check_depth(level);
  switch (j.type()) {
    case Json::value_t::null:
      out += "None";
      return;
    case Json::value_t::boolean:
      out += j.get<bool>() ? "True" : "False";
      return;
    case Json::value_t::number_float:
      out += float_repr(j.get<double>());
      return;
    case Json::value_t::string:
      out += string_repr(j.get_ref<const std::string&>());
      return;
    case Json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += ", ";
        repr_into(j[i], out, level + 1);
      }
      out += ']';
      return;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : j.items()) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(key);
        out += ": ";
        repr_into(value, out, level + 1);
      }
      out += '}';
      return;
    }
    default:
      out += j.dump();  // integers
  }
}

void json_string_into(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (std::string_view c : pystr::chars(s)) {
    const unsigned char b = c[0];
    switch (b) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (b < 0x20) {
      out += hex_escape("\\u%04x", b);
    } else if (ensure_ascii && b >= 0x80) {
      const char32_t cp = utf8::decode_one(c).valid ? utf8::code_point(c) : 0xFFFD;
      if (cp >= 0x10000) {  // a surrogate pair, as Python writes it
        out += hex_escape("\\u%04x", 0xD800 + ((cp - 0x10000) >> 10));
        out += hex_escape("\\u%04x", 0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        out += hex_escape("\\u%04x", cp);
      }
    } else {
      out += c;
    }
  }
  out += '"';
}

std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return float_repr(x);
}

void dumps_into(const Json& j, const DumpOptions& o, int level, std::string& out) {
  check_depth(level);
  auto newline = [&](int at) {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < at; ++i) out += *o.indent;
  };
  if (j.is_array() || j.is_object()) {
    const bool array = j.is_array();
    if (j.empty()) {
      out += array ? "[]" : "{}";
      return;
    }
    out += array ? '[' : '{';
    std::vector<std::pair<std::string, const Json*>> entries;
    if (!array) {
      for (const auto& [key, value] : j.items()) entries.emplace_back(key, &value);
      if (o.sort_keys) std::stable_sort(entries.begin(), entries.end());
    }
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += *o.item_separator;
      newline(level + 1);
      if (array) {
        dumps_into(j[i], o, level + 1, out);
        continue;
      }
      json_string_into(entries[i].first, o.ensure_ascii, out);
      out += o.key_separator;
      dumps_into(*entries[i].second, o, level + 1, out);
    }
    newline(level);
    out += array ? ']' : '}';
  } else if (j.is_string()) {
    json_string_into(j.get_ref<const std::string&>(), o.ensure_ascii, out);
  } else if (j.is_number_float()) {
    out += json_float(j.get<double>());
  } else {
    out += j.dump();  // null, true, false, integers
  }
}

}  // namespace

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  // The shortest digits that round-trip, as Python's repr picks them: "d.ddde[+-]xx".
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  bool negative = false;
  for (char c : sci.substr(0, e)) {
    if (c == '-') negative = true;
    if (c >= '0' && c <= '9') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= 16 || exponent < -4) {  // Python's switch to exponent notation
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) return absl::StrCat(out, "0.", std::string(-exponent - 1, '0'), digits);
  const size_t whole = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= whole)
    return absl::StrCat(out, digits, std::string(whole - digits.size(), '0'), ".0");
  return absl::StrCat(out, digits.substr(0, whole), ".", digits.substr(whole));
}

std::string py_repr(const Json& j) {
  std::string out;
  repr_into(j, out, 0);
  return out;
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNamespace:
      return absl::StrCat("<Namespace ", py_repr(*v.ns), ">");
    case Value::Kind::kFunction:
      return absl::StrCat("<function ", v.name, ">");
    case Value::Kind::kData:
      break;
  }
  if (v.data.is_string()) return v.data.get<std::string>();
  return py_repr(v.data);
}

std::string json_dumps(const Json& j, const DumpOptions& options) {
  DumpOptions o = options;
  if (!o.item_separator) o.item_separator = o.indent ? "," : ", ";
  std::string out;
  dumps_into(j, o, 0, out);
  return out;
}

}  // namespace fpa::jinja
