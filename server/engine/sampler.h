// Token samplers: greedy (temperature 0), temperature, top-k, top-p, min-p; seeded and
// reproducible. Before choosing, the logits go through vLLM's processing (logit_processing.h):
// min_tokens, logit_bias, then repetition/presence/frequency penalties over the sequence so far.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "server/engine/logit_processing.h"

namespace fpa {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  float min_p = 0.0f;     // 0 = off: drops tokens less likely than min_p x the likeliest
  int top_logprobs = 0;   // alternatives reported with each token's log-probability
  LogitRules rules = {};  // penalties, bias, min_tokens
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// A token's log-probability and the `top` likeliest tokens at its position, likeliest first.
struct Scored {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
  int32_t rank = 0;  // 1 + the ids likelier than the token
};

// `token`'s log-probability under softmax(logits / temperature) with the n likeliest tokens.
Scored score(std::span<const float> logits, int32_t token, int n, float temperature = 1.0f);

class Sampler {
 public:
  // `prompt` counts as seen for repetition_penalty; every sampled token is recorded.
  explicit Sampler(const SamplingParams& params, std::span<const int32_t> prompt = {});
  // Picks a token from the model's logits. With `scored`, writes its log-probability (and
  // top_logprobs alternatives) under the model's distribution at the temperature (1 when greedy)
  // before penalties, bias and filters, as vLLM reports them.
  int32_t sample(std::span<const float> logits, Scored* scored = nullptr);

 private:
  int32_t choose(std::span<const float> logits);

  SamplingParams params_;
  LogitHistory history_;
  std::vector<float> work_;  // the processed logits
  std::mt19937_64 rng_;
};

}  // namespace fpa
