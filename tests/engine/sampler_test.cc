// Samplers (greedy, temperature, top-k, top-p, min-p; seeded), vLLM's penalties, bias and
// min_tokens, and top_logprobs.
#include "server/engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace fpa {
namespace {

std::map<int32_t, int> histogram(const SamplingParams& p, const std::vector<float>& logits,
                                 int draws) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) ++h[s.sample(logits)];
  return h;
}

TEST(Sampler, GreedyPicksTheArgmaxWithItsLogProb) {
  Sampler s({});
  const std::vector<float> logits = {0.0f, 3.0f, NAN, 1.0f, 3.0f};
  Scored scored;
  EXPECT_EQ(s.sample(logits, &scored), 1);  // first of the tied maxima; NaN never wins
  const double z = 1 + 2 * std::exp(3.0) + std::exp(1.0);
  EXPECT_NEAR(scored.logprob, 3.0 - std::log(z), 1e-5);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.3f);
  auto run = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, TemperatureMatchesTheSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4 at T = 1
  auto h = histogram({.temperature = 1.0f, .seed = 1}, logits, 20000);
  EXPECT_NEAR(h[1] / 20000.0, 0.75, 0.015);
  h = histogram({.temperature = 0.5f, .seed = 1}, logits, 20000);  // p ~ 1:9
  EXPECT_NEAR(h[1] / 20000.0, 0.9, 0.01);
  Scored scored;
  Sampler s({.temperature = 0.5f, .seed = 3});
  const int32_t tok = s.sample(logits, &scored);
  EXPECT_NEAR(scored.logprob, std::log(tok == 1 ? 0.9 : 0.1), 1e-5);
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  const std::vector<float> logits = {1.0f, 5.0f, 4.0f, 0.5f, 4.5f};
  auto h = histogram({.temperature = 5.0f, .top_k = 2, .seed = 2}, logits, 5000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h[1], 0);
  EXPECT_GT(h[4], 0);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // p = 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps the first two (0.8 >= 0.75), never the rest.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  auto h = histogram({.temperature = 1.0f, .top_p = 0.75f, .seed = 3}, logits, 20000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  EXPECT_NEAR(h[0] / 20000.0, 0.5 / 0.8, 0.015);
  h = histogram({.temperature = 1.0f, .top_p = 0.01f, .seed = 3}, logits, 100);
  EXPECT_EQ(h[0], 100);  // a tiny nucleus still holds the best token
}

TEST(Sampler, MinPDropsTokensBelowItsShareOfTheLikeliest) {
  // p = 0.5, 0.3, 0.15, 0.05: min_p 0.25 keeps tokens with p >= 0.125 (0, 1, 2).
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  auto h = histogram({.temperature = 1.0f, .seed = 4, .min_p = 0.25f}, logits, 20000);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_NEAR(h[2] / 20000.0, 0.15 / 0.95, 0.01);
}

// Hugging Face's rule: a seen token's positive logit is divided, a negative one multiplied.
TEST(Sampler, RepetitionPenaltyCoversPromptAndOutput) {
  const std::vector<int32_t> prompt = {0};
  SamplingParams p{.rules = {.repetition_penalty = 2.0f}};
  Sampler s(p, prompt);
  // Token 0 (seen in the prompt) 3.0 -> 1.5 loses to token 1's 2.0.
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 2.0f, -1.0f}), 1);
  // Now 1 is seen too: 2.0 -> 1.0 loses to 2's 1.5; negative 0 -> -2 x 2.
  EXPECT_EQ(s.sample(std::vector<float>{-1.0f, 2.0f, 1.5f}), 2);
  // Unpenalized, the same logits pick 1.
  Sampler plain({}, prompt);
  EXPECT_EQ(plain.sample(std::vector<float>{-1.0f, 2.0f, 1.5f}), 1);
}

// OpenAI's rule over the output only: logit -= frequency x count + presence x (count > 0).
TEST(Sampler, PresenceAndFrequencyPenalizeOnlyTheOutput) {
  const std::vector<int32_t> prompt = {1};
  Sampler s({.rules = {.presence_penalty = 0.5f, .frequency_penalty = 0.3f}}, prompt);
  const std::vector<float> logits = {2.0f, 2.5f, 1.0f};
  EXPECT_EQ(s.sample(logits), 1);  // the prompt's 1 is not penalized
  EXPECT_EQ(s.sample(logits), 0);  // 2.5 - 0.8 = 1.7 < 2.0
  EXPECT_EQ(s.sample(logits), 1);  // 0: 2.0 - 0.8 = 1.2 < 1.7
  EXPECT_EQ(s.sample(logits), 1);  // 1: 2.5 - 0.5 - 0.6 = 1.4 still beats 0's 1.2
  EXPECT_EQ(s.sample(logits), 0);  // 1: 2.5 - 0.5 - 0.9 = 1.1 < 1.2
}

TEST(Sampler, LogitBiasAndMinTokens) {
  Sampler biased({.rules = {.logit_bias = {{2, 5.0f}}}});
  EXPECT_EQ(biased.sample(std::vector<float>{3.0f, 1.0f, -1.0f}), 2);
  // EOS (2) is out of reach for the first two tokens, then allowed.
  Sampler s({.rules = {.min_tokens = 2, .end_ids = {2}}});
  const std::vector<float> logits = {0.0f, 1.0f, 9.0f};
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_EQ(s.sample(logits), 2);
}

TEST(Sampler, AllowedTokenIdsAreTheOnlyOnesSampled) {
  const std::vector<float> logits = {9.0f, 1.0f, 3.0f, 2.0f};
  Sampler greedy({.rules = {.allowed_ids = {1, 3}}});
  EXPECT_EQ(greedy.sample(logits), 3);
  const auto h = histogram({.temperature = 5.0f, .rules = {.allowed_ids = {1, 3}}}, logits, 400);
  EXPECT_EQ(h.count(0) + h.count(2), 0u);
  EXPECT_GT(h.at(1), 0);
}

// vLLM's rule: a word of one id is never sampled; the last id of a longer one is masked only
// right after the output has produced the ids before it.
TEST(Sampler, BadWordsMaskTheIdThatWouldCompleteThem) {
  Sampler single({.rules = {.bad_words = {{0}}}});
  EXPECT_EQ(single.sample(std::vector<float>{5.0f, 1.0f}), 1);
  Sampler s({.rules = {.bad_words = {{1, 2}}}});
  EXPECT_EQ(s.sample(std::vector<float>{0.0f, 9.0f, 5.0f}), 1);  // 1 alone is fine
  EXPECT_EQ(s.sample(std::vector<float>{0.0f, 1.0f, 5.0f}), 1);  // 2 would complete [1, 2]
  Sampler other({.rules = {.bad_words = {{1, 2}}}});
  EXPECT_EQ(other.sample(std::vector<float>{9.0f, 1.0f, 5.0f}), 0);
  EXPECT_EQ(other.sample(std::vector<float>{0.0f, 1.0f, 5.0f}), 2);  // after 0, 2 is fine
}

TEST(Sampler, ScoreRanksTheTokenAmongTheVocabulary) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f};
  EXPECT_EQ(score(logits, 1, 0).rank, 1);
  EXPECT_EQ(score(logits, 2, 0).rank, 3);
  EXPECT_EQ(score(logits, 0, 0).rank, 4);
}

// Reported log-probabilities are the model's, before penalties and bias, as vLLM's.
TEST(Sampler, TopLogprobsAreTheLikeliestUnderTheModel) {
  Sampler s({.top_logprobs = 2, .rules = {.logit_bias = {{0, 10.0f}}}});
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f};
  Scored scored;
  EXPECT_EQ(s.sample(logits, &scored), 0);
  const double z = std::log(1 + std::exp(2.0) + std::exp(1.0));
  EXPECT_NEAR(scored.logprob, 0.0 - z, 1e-5);
  ASSERT_EQ(scored.top.size(), 2u);
  EXPECT_EQ(scored.top[0].token, 1);
  EXPECT_NEAR(scored.top[0].logprob, 2.0 - z, 1e-5);
  EXPECT_EQ(scored.top[1].token, 2);
}

}  // namespace
}  // namespace fpa
