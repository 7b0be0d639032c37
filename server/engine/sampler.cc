#include "server/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace fpa {
namespace {

// NaN logits never win and never get mass.
float clean(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (clean(logits[i]) > clean(logits[best])) best = static_cast<int32_t>(i);
  }
  return best;
}

// log-softmax of logits / temperature at `token` (log-sum-exp in double).
float log_prob(std::span<const float> logits, float temperature, int32_t token) {
  const float mx = clean(logits[argmax(logits)]);
  if (!std::isfinite(mx)) return 0.0f;
  double sum = 0.0;
  for (float x : logits) sum += std::exp((static_cast<double>(clean(x)) - mx) / temperature);
  return static_cast<float>((clean(logits[token]) - mx) / temperature - std::log(sum));
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(std::span<const float> logits, float* logprob) {
  if (logits.empty()) return 0;
  if (!(params_.temperature > 0.0f)) {
    const int32_t token = argmax(logits);
    if (logprob != nullptr) *logprob = log_prob(logits, 1.0f, token);
    return token;
  }
  const float t = params_.temperature;
  // Candidates in descending logit order, cut by top-k and then top-p.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  size_t keep = order.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    return clean(logits[a]) > clean(logits[b]) || (clean(logits[a]) == clean(logits[b]) && a < b);
  });
  const double mx = clean(logits[order[0]]);
  if (!std::isfinite(mx)) return order[0];
  std::vector<double> p(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp((clean(logits[order[i]]) - mx) / t);
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < keep && (n == 0 || cum < params_.top_p * total)) cum += p[n++];
    keep = n;
    total = cum;
  }
  // 53 random bits -> u in [0, 1): the same stream on every platform for a given seed.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cum = 0.0;
  int32_t token = order[keep - 1];
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) {
      token = order[i];
      break;
    }
  }
  if (logprob != nullptr) *logprob = log_prob(logits, t, token);
  return token;
}

}  // namespace fpa
