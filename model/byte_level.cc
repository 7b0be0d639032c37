#include "model/byte_level.h"

#include <array>

#include "model/utf8.h"

namespace fpa::byte_level {
namespace {

// Code point -> byte, -1 outside the alphabet (code points below 324).
constexpr size_t kAlphabetEnd = 324;

std::array<int, kAlphabetEnd> make_decoder() {
  std::array<int, kAlphabetEnd> to_byte;
  to_byte.fill(-1);
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 256;  // the bytes without a printable self take 256, 257, ... in byte order
  for (int b = 0; b < 256; ++b) to_byte[printable(b) ? b : next++] = b;
  return to_byte;
}

}  // namespace

std::optional<std::string> to_bytes(std::string_view spelled) {
  static const std::array<int, kAlphabetEnd> to_byte = make_decoder();
  std::string out;
  size_t i = 0;
  while (i < spelled.size()) {
    utf8::Decoded d = utf8::decode_one(spelled.substr(i));
    if (!d.valid) return std::nullopt;
    char32_t c = utf8::code_point(spelled.substr(i));
    if (c >= kAlphabetEnd || to_byte[c] < 0) return std::nullopt;
    out.push_back(static_cast<char>(to_byte[c]));
    i += d.length;
  }
  return out;
}

}  // namespace fpa::byte_level
