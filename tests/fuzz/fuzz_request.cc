// Bytes -> GenerateRequest -> GenerationParams, the path every Generate and GenerateStream call
// takes (server/grpc/wire.h decode, then server/request/validate.h to_params). What passes must be
// within the limits the scheduler and the cache rely on.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cache/policy.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "server/grpc/wire.h"
#include "server/request/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fpa::v1::GenerateRequest req;
  if (!fpa::server::decode(bytes, &req).ok()) return 0;
  static const std::unique_ptr<fpa::Tokenizer> tokenizer = [] {
    fpa::ModelConfig config;
    config.vocab_size = 259;
    return fpa::make_byte_tokenizer(config);
  }();
  const fpa::server::RequestLimits limits{259, tokenizer.get(), 512, 128, 20.0f};
  absl::StatusOr<fpa::server::GenerationParams> p = fpa::server::to_params(req, limits);
  if (!p.ok()) {
    if (p.status().message().size() > 400) std::abort();  // echoed values are cut
    return 0;
  }
  // Only a scored prompt (prompt_logprobs) may ask for no new token.
  const int least = p->prompt_logprobs ? 0 : 1;
  if (p->prompt.empty() || static_cast<int>(p->prompt.size()) > limits.max_prompt_tokens ||
      p->max_new_tokens < least || p->max_new_tokens > limits.max_new_tokens) {
    std::abort();
  }
  for (int32_t id : p->prompt) {
    if (id < 0 || id >= limits.vocab_size) std::abort();
  }
  // The sampler's inputs are in the ranges it assumes.
  const fpa::LogitRules& rules = p->sampling.rules;
  if (!(rules.repetition_penalty > 0) || p->sampling.top_logprobs < 0 ||
      p->sampling.top_logprobs > 20 || rules.min_tokens > p->max_new_tokens) {
    std::abort();
  }
  for (const auto& [id, bias] : rules.logit_bias) {
    if (id < 0 || id >= limits.vocab_size || !(bias >= -100 && bias <= 100)) std::abort();
  }
  for (int32_t id : rules.allowed_ids) {
    if (id < 0 || id >= limits.vocab_size) std::abort();
  }
  for (const std::vector<int32_t>& word : rules.bad_words) {  // the sampler reads word.back()
    if (word.empty()) std::abort();
  }
  if (p->prompt_top_logprobs < 0 || p->prompt_top_logprobs > 20) std::abort();
  // Validation lives in one place: the cache must never refuse what the service accepted.
  if (!fpa::cache::validate_policy(p->policy).ok()) std::abort();
  return 0;
}
