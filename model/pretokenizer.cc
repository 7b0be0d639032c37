#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/pretokenizer.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace fpa {

struct Pretokenizer::Code {
  explicit Code(pcre2_code* r) : re(r) {}
  Code(const Code&) = delete;
  ~Code() { pcre2_code_free(re); }
  pcre2_code* re;
};

absl::StatusOr<Pretokenizer> Pretokenizer::compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (re == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    return absl::InvalidArgumentError(absl::StrCat(
        "pre-tokenizer pattern: ", reinterpret_cast<char*>(message), " at offset ", offset));
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // a speed-up only: matching works without it
  return Pretokenizer(std::make_shared<const Code>(re));
}

std::vector<std::string_view> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_->re, nullptr);
  size_t start = 0, copied = 0;  // copied: text[0, copied) is in pieces
  while (start < text.size()) {
    int rc = pcre2_match(code_->re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                         PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    if (ov[0] > copied) pieces.push_back(text.substr(copied, ov[0] - copied));
    if (ov[1] > ov[0]) pieces.push_back(text.substr(ov[0], ov[1] - ov[0]));
    copied = ov[1];
    // An empty match moves on by one character, not one byte.
    start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      ++start;
    }
  }
  if (copied < text.size()) pieces.push_back(text.substr(copied));
  pcre2_match_data_free(match);
  return pieces;
}

}  // namespace fpa
