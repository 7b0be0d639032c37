// One tokenizer interface for the byte tokenizer of fpa-serve/1 models and byte-level BPE
// (GPT-2's vocab.json + merges.txt, or tokenizer.json), plus TokenStream, which turns generated
// ids into text a whole UTF-8 character at a time (docs/model-format.md#tokenizers).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/json_escape.h"

namespace fpa {

struct ModelConfig;
struct ModelChatTemplate;

struct SpecialTokens {
  std::optional<int32_t> bos, eos, pad, unk;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Prompt ids, with the BOS id first when the tokenizer adds one. Invalid UTF-8 in `text` is
  // read as U+FFFD by tokenizers that need characters (BPE); the byte tokenizer keeps the bytes.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes id stands for before any post-processing (JSON unescaping); empty for special
  // tokens and ids outside the vocabulary, which carry no text.
  virtual std::string_view token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int vocab_size() const = 0;
  virtual const SpecialTokens& special() const = 0;
  // "byte", or "bpe" (+ "-json" when text is JSON-escaped), for ModelInfo and /v1/models.
  virtual std::string kind() const = 0;
  // LongCrawl64's tokenizer (the FoX checkpoints) JSON-escapes text before encoding and
  // unescapes after decoding.
  virtual bool json_escaped() const { return false; }

  // The text of ids, special tokens skipped, invalid UTF-8 as U+FFFD.
  std::string decode(std::span<const int32_t> ids) const;

  // The model's own chat template; null when it has none (chat uses the default).
  const ModelChatTemplate* chat_template() const { return chat_template_.get(); }
  void set_chat_template(std::shared_ptr<const ModelChatTemplate> t) {
    chat_template_ = std::move(t);
  }

 private:
  std::shared_ptr<const ModelChatTemplate> chat_template_;
};

// Streams the text of generated ids: push returns only whole, valid characters.
class TokenStream {
 public:
  explicit TokenStream(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  // The characters completed by ids; invalid bytes come out as U+FFFD.
  std::string push(std::span<const int32_t> ids);
  // Flushes what is held back (an incomplete escape literally, a truncated character as U+FFFD).
  std::string finish();
  // Every decoded byte so far (unescaped, not yet UTF-8-checked), for matching stop sequences.
  const std::string& bytes() const { return bytes_; }

 private:
  std::string emit_complete();

  const Tokenizer* tokenizer_;
  JsonUnescaper unescaper_;  // json_escaped() only
  std::string bytes_;
  size_t emitted_ = 0;  // bytes_[0, emitted_) have been returned
};

// The ids of `text` without the BOS the tokenizer adds in front (an empty text stays empty):
// a piece of text inside a prompt (a rendered chat, a bad word), not a prompt of its own.
std::vector<int32_t> encode_without_bos(std::string_view text, const Tokenizer& tokenizer);

// The byte tokenizer of fpa-serve/1 models: [BOS] + UTF-8 bytes; ids 0-255 are bytes and the
// config's bos/eos/pad ids are special.
std::unique_ptr<Tokenizer> make_byte_tokenizer(const ModelConfig& config);

// The tokenizer of a model directory, found by the usual file names: tokenizer.json, else
// vocab.json + merges.txt (with tokenizer_config.json and special_tokens_map.json when present),
// else the byte tokenizer of `config`. Errors name the file and key.
absl::StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir,
                                                          const ModelConfig& config);

}  // namespace fpa
