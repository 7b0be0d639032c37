// What the CPU and CUDA parity suites both measure: the error scale and a stream's live keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
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

}  // namespace fpa
