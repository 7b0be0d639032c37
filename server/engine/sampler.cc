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

// Higher logit first, lower id on ties: the one order for sampling and top_logprobs.
auto likelier(std::span<const float> logits) {
  return [logits](int32_t a, int32_t b) {
    return clean(logits[a]) > clean(logits[b]) || (clean(logits[a]) == clean(logits[b]) && a < b);
  };
}

// The first n ids in `likelier` order (the rest unordered).
std::vector<int32_t> best_first(std::span<const float> logits, size_t n) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  n = std::min(n, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    likelier(logits));
  return order;
}

}  // namespace

Scored score(std::span<const float> logits, int32_t token, int n, float temperature) {
  Scored s;
  if (logits.empty()) return s;
  const float mx = clean(logits[argmax(logits)]);
  if (!std::isfinite(mx)) return s;
  // log-sum-exp in double.
  double sum = 0.0;
  for (float x : logits) sum += std::exp((static_cast<double>(clean(x)) - mx) / temperature);
  const double log_z = std::log(sum);
  auto log_prob = [&](int32_t id) {
    return static_cast<float>((clean(logits[id]) - mx) / temperature - log_z);
  };
  s.logprob = log_prob(token);
  const float own = clean(logits[token]);
  s.rank = 1 + static_cast<int32_t>(
                   std::ranges::count_if(logits, [own](float x) { return clean(x) > own; }));
  if (n > 0) {
    const std::vector<int32_t> order = best_first(logits, static_cast<size_t>(n));
    for (size_t i = 0; i < static_cast<size_t>(n) && i < order.size(); ++i) {
      s.top.push_back({order[i], log_prob(order[i])});
    }
  }
  return s;
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt)
    : params_(params), history_(params.rules, prompt), rng_(params.seed) {}

int32_t Sampler::sample(std::span<const float> logits, Scored* scored) {
  if (logits.empty()) return 0;
  work_.assign(logits.begin(), logits.end());
  history_.apply(params_.rules, work_);
  const int32_t token = choose(work_);
  history_.record(token);
  if (scored != nullptr) {
    const float t = params_.temperature > 0.0f ? params_.temperature : 1.0f;
    *scored = score(logits, token, params_.top_logprobs, t);
  }
  return token;
}

// Candidates in descending logit order, cut by top-k, min-p and then top-p, and one drawn.
int32_t Sampler::choose(std::span<const float> logits) {
  if (!(params_.temperature > 0.0f)) return argmax(logits);
  const float t = params_.temperature;
  size_t keep = logits.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  const std::vector<int32_t> order = best_first(logits, keep);
  const double mx = clean(logits[order[0]]);
  if (!std::isfinite(mx)) return order[0];
  std::vector<double> p(keep);  // relative to the likeliest: p[0] = 1
  double total = 0.0;
  size_t n = 0;
  for (; n < keep; ++n) {
    p[n] = std::exp((clean(logits[order[n]]) - mx) / t);
    if (n > 0 && p[n] < params_.min_p) break;
    total += p[n];
  }
  keep = n;
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    n = 0;
    while (n < keep && (n == 0 || cum < params_.top_p * total)) cum += p[n++];
    keep = n;
    total = cum;
  }
  // 53 random bits -> u in [0, 1): the same stream on every platform for a given seed.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return order[i];
  }
  return order[keep - 1];
}

}  // namespace fpa
