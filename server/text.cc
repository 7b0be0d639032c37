#include "server/text.h"

namespace fpa::server {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// The UTF-8 character at the start of s (RFC 3629: no overlongs, no surrogates):
// {n, true} for a valid one of n bytes; {n, false} for an invalid maximal subpart of n bytes
// (one U+FFFD each, as Python and WHATWG decoders do); {0, false} when s ends inside a character
// that could still complete.
struct Decoded {
  int length;
  bool valid;
};

Decoded decode_one(std::string_view s) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(0);
  if (c < 0x80) return {1, true};
  int n;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {1, false};
  }
  for (int i = 1; i < n; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return {0, false};
    unsigned char min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
    if (b(i) < min || b(i) > max) return {i, false};
  }
  return {n, true};
}

}  // namespace

std::vector<int32_t> encode_prompt(std::string_view text, int32_t bos_id) {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  ids.push_back(bos_id);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string Utf8Decoder::push(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) bytes_.push_back(static_cast<char>(id));
  }
  std::string out;
  while (emitted_ < bytes_.size()) {
    Decoded d = decode_one(std::string_view(bytes_).substr(emitted_));
    if (d.length == 0) break;  // wait for the rest of the character
    if (d.valid) {
      out.append(bytes_, emitted_, d.length);
    } else {
      out += kReplacement;
    }
    emitted_ += d.length;
  }
  return out;
}

std::string Utf8Decoder::finish() {
  std::string out;
  if (emitted_ < bytes_.size()) out = kReplacement;
  emitted_ = bytes_.size();
  return out;
}

}  // namespace fpa::server
