#include "kernels/cpu/shift_state.h"

#include <algorithm>
#include <cmath>

#include "kernels/shift_rule.h"
#include "model/status_macros.h"

namespace fpa::cpu {

absl::Status ShiftStates::begin(std::span<const cache::BatchItem> items,
                                const cache::KvView& cache) {
  absl::erase_if(states_, [&](const auto& entry) { return !cache.contains(entry.first); });
  for (const cache::BatchItem& it : items) {
    if (it.start_pos == 0) {
      states_[it.seq] = {0, std::vector<float>(static_cast<size_t>(n_layers_) * 2 * width_)};
      continue;
    }
    const auto found = states_.find(it.seq);
    FPA_RETURN_IF_ERROR(check_shift_continues(
        it, found == states_.end() ? std::nullopt : std::optional(found->second.next_pos)));
  }
  return absl::OkStatus();
}

void ShiftStates::end(std::span<const cache::BatchItem> items) {
  for (const cache::BatchItem& it : items) {
    states_[it.seq].next_pos = it.start_pos + static_cast<int32_t>(it.tokens.size());
  }
}

void ShiftStates::copy(cache::SeqId from, cache::SeqId to) {
  auto found = states_.find(from);
  if (found == states_.end()) return;
  State rows = found->second;  // inserting `to` may move `from`
  states_[to] = std::move(rows);
}

void ShiftStates::apply(cache::SeqId seq, int layer, int which, const float* a, int n_heads,
                        float* y, int len) {
  float* state = states_.at(seq).rows.data() + (static_cast<long>(layer) * 2 + which) * width_;
  const int hd = width_ / n_heads;
  const std::vector<float> last(y + static_cast<long>(len - 1) * width_,
                                y + static_cast<long>(len) * width_);
  // Backwards, so that row t - 1 is still the projection when row t reads it.
  for (int t = len - 1; t >= 0; --t) {
    float* row = y + static_cast<long>(t) * width_;
    const float* prev = t > 0 ? row - width_ : state;
    for (int h = 0; h < n_heads; ++h) {
      const float alpha = 1.0f / (1.0f + std::exp(-a[static_cast<long>(t) * n_heads + h]));
      for (int e = h * hd; e < (h + 1) * hd; ++e) row[e] = alpha * prev[e] + (1 - alpha) * row[e];
    }
  }
  std::copy(last.begin(), last.end(), state);
}

}  // namespace fpa::cpu
