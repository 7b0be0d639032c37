// The byte tokenizer shared with the trainer (docs/model-format.md).
#include "model/model.h"
#include "model/tokenizer.h"

namespace fpa {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(const ModelConfig& config) : vocab_size_(config.vocab_size) {
    special_.bos = config.bos_id;
    special_.eos = config.eos_id;
    special_.pad = config.pad_id;
    for (int b = 0; b < 256; ++b) bytes_[b] = static_cast<char>(b);
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() + 1);
    ids.push_back(*special_.bos);
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string_view token_bytes(int32_t id) const override {
    return id >= 0 && id < 256 ? std::string_view(&bytes_[id], 1) : std::string_view();
  }
  bool is_special(int32_t id) const override { return id >= 256; }
  int vocab_size() const override { return vocab_size_; }
  const SpecialTokens& special() const override { return special_; }
  std::string kind() const override { return "byte"; }

 private:
  int vocab_size_;
  SpecialTokens special_;
  char bytes_[256];
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer(const ModelConfig& config) {
  return std::make_unique<ByteTokenizer>(config);
}

}  // namespace fpa
