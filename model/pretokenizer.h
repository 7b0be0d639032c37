// Splits text into the pieces BPE merges within, by a regular expression with Unicode classes
// (PCRE2 in UTF + UCP mode, so \s, \p{L} and \p{N} follow Unicode as the Rust and Python regex
// engines of Hugging Face and GPT-2 do).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fpa {

// GPT-2's pre-tokenizer (also the ByteLevel pre-tokenizer of Hugging Face tokenizers).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Pretokenizer {
 public:
  // An error names the pattern's problem and offset.
  static absl::StatusOr<Pretokenizer> compile(std::string_view pattern);
  // The matches of the pattern in valid UTF-8 `text`, and the text between them, in order
  // (Hugging Face's "Isolated" split).
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Code;
  explicit Pretokenizer(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

}  // namespace fpa
