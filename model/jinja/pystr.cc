#include "model/jinja/pystr.h"

#include <algorithm>

#include "model/jinja/value.h"
#include "model/utf8.h"

namespace fpa::jinja::pystr {
namespace {

char32_t code_point_of(std::string_view c) {
  return utf8::decode_one(c).valid ? utf8::code_point(c) : 0xFFFD;
}

// str.isspace for one code point.
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char to_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char to_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

}  // namespace

std::vector<std::string_view> chars(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const int n = std::max(utf8::decode_one(s).length, 1);
    const size_t take = std::min(static_cast<size_t>(n), s.size());
    out.push_back(s.substr(0, take));
    s.remove_prefix(take);
  }
  return out;
}

size_t length(std::string_view s) { return chars(s).size(); }

std::string strip(std::string_view s, const std::optional<std::string>& set, bool left,
                  bool right) {
  const std::vector<std::string_view> cs = chars(s);
  std::vector<std::string_view> strip_set;
  if (set) strip_set = chars(*set);
  auto strippable = [&](std::string_view c) {
    if (!set) return is_space(code_point_of(c));
    return std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end();
  };
  size_t begin = 0, end = cs.size();
  while (left && begin < end && strippable(cs[begin])) ++begin;
  while (right && end > begin && strippable(cs[end - 1])) --end;
  if (begin == end) return "";
  const char* from = cs[begin].data();
  return std::string(from, cs[end - 1].data() + cs[end - 1].size() - from);
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("split(): empty separator");
    size_t at;
    while ((maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
           (at = s.find(*sep)) != std::string_view::npos) {
      out.emplace_back(s.substr(0, at));
      s.remove_prefix(at + sep->size());
    }
    out.emplace_back(s);
    return out;
  }
  const std::vector<std::string_view> cs = chars(s);
  size_t i = 0;
  while (true) {
    while (i < cs.size() && is_space(code_point_of(cs[i]))) ++i;
    if (i == cs.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, without its trailing whitespace, is the last piece.
      out.push_back(strip(s.substr(cs[i].data() - s.data()), std::nullopt, false, true));
      break;
    }
    const size_t start = i;
    while (i < cs.size() && !is_space(code_point_of(cs[i]))) ++i;
    const char* from = cs[start].data();
    out.emplace_back(from, cs[i - 1].data() + cs[i - 1].size() - from);
  }
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  std::vector<std::string> out;
  std::string line;
  const std::vector<std::string_view> cs = chars(s);
  for (size_t i = 0; i < cs.size(); ++i) {
    if (!is_line_break(code_point_of(cs[i]))) {
      line.append(cs[i]);
      continue;
    }
    if (cs[i] == "\r" && i + 1 < cs.size() && cs[i + 1] == "\n") ++i;
    out.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count,
                    size_t max_bytes) {
  std::string out;
  auto append = [&](std::string_view piece) {
    if (out.size() + piece.size() > max_bytes) fail("replace(): the result is too long");
    out.append(piece);
  };
  if (from.empty()) {  // Python inserts `to` before every character and at the end
    const std::vector<std::string_view> cs = chars(s);
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) append(to);
      if (i < cs.size()) append(cs[i]);
    }
    return out;
  }
  size_t at;
  for (int64_t n = 0; (count < 0 || n < count) && (at = s.find(from)) != std::string_view::npos;
       ++n) {
    append(s.substr(0, at));
    append(to);
    s.remove_prefix(at + from.size());
  }
  append(s);
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), to_upper);
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), to_lower);
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

std::string title(std::string_view s) {
  std::string out(s);
  bool after_letter = false;
  for (char& c : out) {
    c = after_letter ? to_lower(c) : to_upper(c);
    after_letter = is_ascii_letter(c);
  }
  return out;
}

}  // namespace fpa::jinja::pystr
