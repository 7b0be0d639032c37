#include "model/tokenizer.h"

#include "model/utf8.h"

namespace fpa {

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  TokenStream stream(*this);
  std::string text = stream.push(ids);
  return text + stream.finish();
}

std::string TokenStream::push(std::span<const int32_t> ids) {
  std::string raw;
  for (int32_t id : ids) raw += tokenizer_->token_bytes(id);
  bytes_ += tokenizer_->json_escaped() ? unescaper_.push(raw) : raw;
  return emit_complete();
}

std::string TokenStream::finish() {
  if (tokenizer_->json_escaped()) bytes_ += unescaper_.finish();
  std::string out = emit_complete();
  if (emitted_ < bytes_.size()) out += utf8::kReplacement;  // a truncated character
  emitted_ = bytes_.size();
  return out;
}

std::string TokenStream::emit_complete() {
  std::string out;
  while (emitted_ < bytes_.size()) {
    utf8::Decoded d = utf8::decode_one(std::string_view(bytes_).substr(emitted_));
    if (d.length == 0) break;  // wait for the rest of the character
    if (d.valid) {
      out.append(bytes_, emitted_, d.length);
    } else {
      out += utf8::kReplacement;
    }
    emitted_ += d.length;
  }
  return out;
}

std::vector<int32_t> encode_without_bos(std::string_view text, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  const std::optional<int32_t> bos = tokenizer.special().bos;
  if (!ids.empty() && bos && ids.front() == *bos) ids.erase(ids.begin());
  return ids;
}

}  // namespace fpa
