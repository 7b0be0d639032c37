#include "model/json_escape.h"

#include <algorithm>
#include <optional>

#include "model/utf8.h"

namespace fpa {
namespace {

void append_u(std::string& out, unsigned unit) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(unit >> shift) & 0xF]);
}

std::optional<unsigned> hex4(std::string_view s) {
  if (s.size() < 4) return std::nullopt;
  unsigned v = 0;
  for (char c : s.substr(0, 4)) {
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<unsigned>(d);
  }
  return v;
}

// Whether s, shorter than a \uXXXX escape, could still become one.
bool unit_prefix(std::string_view s) {
  if (s.size() >= 6 || (!s.empty() && s[0] != '\\') || (s.size() >= 2 && s[1] != 'u')) {
    return false;
  }
  return s.size() <= 2 || hex4(std::string(s.substr(2)) + "000").has_value();
}

bool is_high(unsigned u) { return u >= 0xD800 && u <= 0xDBFF; }
bool is_low(unsigned u) { return u >= 0xDC00 && u <= 0xDFFF; }

}  // namespace

std::string json_escape(std::string_view utf8) {
  std::string out;
  out.reserve(utf8.size());
  size_t i = 0;
  while (i < utf8.size()) {
    unsigned char c = static_cast<unsigned char>(utf8[i]);
    if (c >= 0x80) {
      int n = utf8::decode_one(utf8.substr(i)).length;
      char32_t cp = utf8::code_point(utf8.substr(i));
      if (cp >= 0x10000) {
        append_u(out, 0xD800 + ((cp - 0x10000) >> 10));
        append_u(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        append_u(out, cp);
      }
      i += n;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          append_u(out, c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  return out;
}

std::string JsonUnescaper::push(std::string_view in) {
  pending_ += in;
  return drain(false);
}

std::string JsonUnescaper::finish() { return drain(true); }

std::string JsonUnescaper::drain(bool at_end) {
  std::string out;
  while (!pending_.empty()) {
    size_t slash = pending_.find('\\');
    out.append(pending_, 0, std::min(slash, pending_.size()));
    pending_.erase(0, std::min(slash, pending_.size()));
    if (pending_.empty() || !take_escape(out, at_end)) break;
  }
  return out;
}

// pending_ starts with a backslash.
bool JsonUnescaper::take_escape(std::string& out, bool at_end) {
  if (pending_.size() < 2) {
    if (!at_end) return false;
    out += pending_;
    pending_.clear();
    return true;
  }
  size_t used = 2;
  switch (pending_[1]) {
    case '"':
      out += '"';
      break;
    case '\\':
      out += '\\';
      break;
    case '/':
      out += '/';
      break;
    case 'b':
      out += '\b';
      break;
    case 'f':
      out += '\f';
      break;
    case 'n':
      out += '\n';
      break;
    case 'r':
      out += '\r';
      break;
    case 't':
      out += '\t';
      break;
    case 'u': {
      std::string_view s = pending_;
      if (!at_end && unit_prefix(s)) return false;  // the hex digits may still come
      std::optional<unsigned> unit = hex4(s.substr(2));
      if (!unit) {  // not an escape json.loads accepts: keep the text
        out += "\\u";
        break;
      }
      used = 6;
      if (is_high(*unit)) {
        // A high surrogate pairs with a following \uDC00-\uDFFF.
        std::string_view next = s.substr(6);
        if (!at_end && unit_prefix(next)) return false;
        std::optional<unsigned> low =
            next.size() >= 6 && next.starts_with("\\u") ? hex4(next.substr(2)) : std::nullopt;
        if (low && is_low(*low)) {
          utf8::append(out, 0x10000 + ((*unit - 0xD800) << 10) + (*low - 0xDC00));
          used = 12;
          break;
        }
      }
      utf8::append(out, *unit);  // a lone surrogate becomes U+FFFD
      break;
    }
    default:  // not a JSON escape: keep it
      out.append(pending_, 0, 2);
  }
  pending_.erase(0, used);
  return true;
}

}  // namespace fpa
