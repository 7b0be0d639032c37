// Python str semantics on UTF-8 strings: lengths and indexes count code points, and whitespace
// is Python's (str.isspace). Case mapping covers ASCII only.
// TODO(issue 24): Unicode case mapping for upper/lower/title/capitalize.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fpa::jinja::pystr {

// The code points of s, each as its UTF-8 bytes (an invalid byte sequence is one piece).
std::vector<std::string_view> chars(std::string_view s);

// len(s).
size_t length(std::string_view s);

// s.strip(chars) / lstrip / rstrip; no chars strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& set, bool left, bool right);

// s.split(sep, maxsplit); no sep splits on runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);

// s.splitlines(): lines without their ends (\n, \r\n, \r, \v, \f, \x1c-\x1e, \x85, U+2028/9).
std::vector<std::string> splitlines(std::string_view s);

// s.replace(old, new, count); count < 0 replaces all. Fails past `max_bytes` of result.
std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count,
                    size_t max_bytes);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
// str.capitalize: the first character upper, the rest lower.
std::string capitalize(std::string_view s);
// str.title: a letter after a non-letter upper, other letters lower.
std::string title(std::string_view s);

}  // namespace fpa::jinja::pystr
