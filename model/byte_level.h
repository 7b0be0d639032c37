// GPT-2's byte-level alphabet: every byte has a printable stand-in character, so vocab.json,
// merges.txt and tokenizer.json spell byte strings as text (bytes_to_unicode in GPT-2's code).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fpa::byte_level {

// The raw bytes a vocabulary entry spells; nullopt if some character is not in the alphabet.
std::optional<std::string> to_bytes(std::string_view spelled);

}  // namespace fpa::byte_level
