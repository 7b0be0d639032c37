// UTF-8 (RFC 3629: no overlongs, no surrogates) for tokenizers and streamed text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fpa::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The character at the start of non-empty s: {n, true} for a valid one of n bytes; {n, false}
// for an invalid maximal subpart of n bytes (one U+FFFD each, as Python and WHATWG decoders do);
// {0, false} when s ends inside a character that could still complete.
struct Decoded {
  int length;
  bool valid;
};
Decoded decode_one(std::string_view s);

// s with every invalid maximal subpart (and a truncated tail) replaced by U+FFFD.
std::string sanitize(std::string_view s);

// The code point of the valid character at the start of s (decode_one(s).valid).
char32_t code_point(std::string_view s);

// Appends the UTF-8 bytes of code point c (a scalar value; surrogates become U+FFFD).
void append(std::string& out, char32_t c);

}  // namespace fpa::utf8
