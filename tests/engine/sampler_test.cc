// Samplers (greedy, temperature, top-k, top-p; seeded).
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
  float lp = 0.0f;
  EXPECT_EQ(s.sample(logits, &lp), 1);  // first of the tied maxima; NaN never wins
  const double z = 1 + 2 * std::exp(3.0) + std::exp(1.0);
  EXPECT_NEAR(lp, 3.0 - std::log(z), 1e-5);
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
  float lp = 0.0f;
  Sampler s({.temperature = 0.5f, .seed = 3});
  const int32_t tok = s.sample(logits, &lp);
  EXPECT_NEAR(lp, std::log(tok == 1 ? 0.9 : 0.1), 1e-5);
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

}  // namespace
}  // namespace fpa
