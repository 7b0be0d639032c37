// The byte tokenizer shared with the trainer: token id = UTF-8 byte value, then BOS, EOS, PAD.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"

namespace fpa {

class ByteTokenizer {
 public:
  explicit ByteTokenizer(const ModelConfig& config)
      : bos_(config.bos_id), eos_(config.eos_id), pad_(config.pad_id) {}

  // [BOS] + the bytes of `text`.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of every id below 256; special ids are dropped.
  std::string decode(std::span<const int32_t> ids) const;

  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int32_t pad_id() const { return pad_; }

 private:
  int32_t bos_, eos_, pad_;
};

}  // namespace fpa
