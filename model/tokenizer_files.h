// Readers shared by the tokenizer file formats (tokenizer_files.cc, tokenizer_json.cc).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "model/bpe.h"
#include "nlohmann/json.hpp"

namespace fpa {

// An error naming the file and key.
absl::Status refuse(const std::string& path, const std::string& key, const std::string& what);

// A vocabulary entry's bytes: its byte-level spelling decoded, or the text itself for entries
// outside the byte-level alphabet (added tokens).
std::string entry_bytes(const std::string& spelled);

// {"token": id, ...} into spec.vocab.
absl::Status read_vocab(const nlohmann::json& vocab, const std::string& path, BpeSpec& spec);

// One merge, "a b" (merges.txt, older tokenizer.json) or ["a", "b"], appended to spec.merges.
absl::Status add_merge(const nlohmann::json& m, const std::string& path, size_t rank,
                       BpeSpec& spec);

// An added token {"content", "special", ...} with the given id; `key` names it in errors.
absl::Status read_added_token(const nlohmann::json& t, const std::string& key,
                              const std::string& path, int32_t id, BpeSpec& spec);

// tokenizer.json of a BPE model under a ByteLevel pre-tokenizer.
absl::Status read_tokenizer_json(const std::string& path, BpeSpec& spec);

}  // namespace fpa
