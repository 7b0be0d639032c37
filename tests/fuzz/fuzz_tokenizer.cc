// Bytes -> byte-level BPE (model/bpe.h) and back: whatever the text, encoding never fails or
// hangs, decoding gives the text back (invalid UTF-8 as U+FFFD), streaming one id at a time gives
// the same text, and the same holds with LongCrawl64's JSON escaping.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "model/bpe.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "model/utf8.h"

namespace {

std::unique_ptr<fpa::Tokenizer> make(bool json_escape) {
  fpa::BpeSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(1, static_cast<char>(b));
  spec.merges = {{"t", "h"},   {"th", "e"}, {" ", "t"},       {" ", " "},
                 {"  ", "  "}, {"\\", "u"}, {"\xC3", "\xA9"}, {"e", "r"}};
  for (const auto& [a, b] : spec.merges) spec.vocab.push_back(a + b);
  spec.pattern = fpa::kGpt2Pattern;
  spec.json_escape = json_escape;
  auto tokenizer = fpa::make_bpe_tokenizer(std::move(spec));
  if (!tokenizer.ok()) std::abort();
  return std::move(*tokenizer);
}

void check(const fpa::Tokenizer& tokenizer, std::string_view text) {
  const std::vector<int32_t> ids = tokenizer.encode(text);
  const std::string want = fpa::utf8::sanitize(text);
  if (tokenizer.decode(ids) != want) std::abort();
  fpa::TokenStream stream(tokenizer);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = stream.push(std::span(&id, 1));
    if (fpa::utf8::sanitize(piece) != piece) std::abort();  // whole, valid characters only
    streamed += piece;
  }
  if (streamed + stream.finish() != want) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<fpa::Tokenizer> plain = make(false), escaped = make(true);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check(*plain, text);
  check(*escaped, text);
  return 0;
}
