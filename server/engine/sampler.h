// Token samplers: greedy (temperature 0), temperature, top-k, top-p; seeded and reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace fpa {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from logits; writes its log-probability (under the temperature-scaled,
  // unfiltered distribution) to *logprob when given.
  int32_t sample(std::span<const float> logits, float* logprob = nullptr);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace fpa
