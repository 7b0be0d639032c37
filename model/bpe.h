// Byte-level BPE (GPT-2; Hugging Face's BPE model under a ByteLevel pre-tokenizer), built from
// the already-read files (tokenizer_files.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace fpa {

struct AddedToken {
  int32_t id;
  std::string content;  // matched literally in the text, before pre-tokenization
  bool special;         // special tokens carry no text when decoding
};

struct BpeSpec {
  std::vector<std::string> vocab;                           // id -> the raw bytes it stands for
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, by rank
  std::vector<AddedToken> added;
  std::string pattern;            // pre-tokenizer; empty: one piece per segment
  bool add_prefix_space = false;  // a space before each segment not starting with one
  bool ignore_merges = false;     // a piece in the vocabulary is one token
  bool json_escape = false;
  bool add_bos = false;
  SpecialTokens special;
};

// Errors name what does not fit (a merge whose parts or result are not in the vocabulary, a
// byte without a token, a bad pattern).
absl::StatusOr<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(BpeSpec spec);

}  // namespace fpa
