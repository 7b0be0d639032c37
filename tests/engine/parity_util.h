// What the CPU and CUDA parity suites both measure: the error scale and a stream's live keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cache/kv_cache.h"

namespace fpa {

// max |ours - reference| / max |reference|: one scale for a whole logits or activations tensor.
inline double rel_error(std::span<const float> ours, std::span<const float> ref) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::fabs(double(ours[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return err / std::max(scale, 1e-30);
}

// Sorted positions of the keys the cache records as live in one (layer, head) stream.
inline std::vector<int32_t> live_positions(cache::KvCache& cache, cache::SeqId seq, int layer,
                                           int head) {
  std::vector<int32_t> out;
  for (int32_t id : cache.pages(seq, layer, head)) {
    const cache::PageView v = cache.page(id);
    for (int s = 0; s < cache.shape().page_slots; ++s) {
      if (v.pos[s] >= 0) out.push_back(v.pos[s]);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One sequence's share of a batch: tokens [at, at + n) of the case.
struct Piece {
  int seq;  // index into the plans
  int at, n;
};

// Sequences that run the case's T tokens side by side: {tokens in the first batch, tokens in each
// later one}. A prompt in chunks of 7 over the keys its earlier chunks left, between two sequences
// that decode a token per batch after a first piece.
inline constexpr std::pair<int, int> kMixedPlans[] = {{16, 1}, {7, 7}, {9, 1}};

// The batches of `plans` over T tokens, until every sequence has taken all of them.
inline std::vector<std::vector<Piece>> mixed_batches(
    int T, std::span<const std::pair<int, int>> plans = kMixedPlans) {
  std::vector<int> at(plans.size(), 0);
  std::vector<std::vector<Piece>> batches;
  for (bool first = true;; first = false) {
    std::vector<Piece> batch;
    for (size_t k = 0; k < plans.size(); ++k) {
      const int n = std::min(first ? plans[k].first : plans[k].second, T - at[k]);
      if (n == 0) continue;
      batch.push_back({static_cast<int>(k), at[k], n});
      at[k] += n;
    }
    if (batch.empty()) return batches;
    batches.push_back(std::move(batch));
  }
}

}  // namespace fpa
