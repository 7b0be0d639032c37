#include "server/engine/logit_processing.h"

#include <algorithm>
#include <limits>

namespace fpa {
namespace {

bool in_range(std::span<float> logits, int32_t token) {
  return token >= 0 && static_cast<size_t>(token) < logits.size();
}

float repeat_penalized(float logit, float penalty) {
  return logit > 0 ? logit / penalty : logit * penalty;
}

}  // namespace

LogitHistory::LogitHistory(const LogitRules& rules, std::span<const int32_t> prompt)
    : counts_output_(rules.penalizes()) {
  // Only repetition_penalty looks at the prompt; the others keep no copy of it.
  if (rules.repetition_penalty == 1.0f) return;
  prompt_.assign(prompt.begin(), prompt.end());
  std::ranges::sort(prompt_);
  prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
}

void LogitHistory::record(int32_t token) {
  if (counts_output_) ++counts_[token];
  ++generated_;
}

void LogitHistory::apply(const LogitRules& rules, std::span<float> logits) const {
  if (generated_ < rules.min_tokens) {
    for (int32_t id : rules.end_ids) {
      if (in_range(logits, id)) logits[id] = -std::numeric_limits<float>::infinity();
    }
  }
  for (const auto& [id, bias] : rules.logit_bias) {
    if (in_range(logits, id)) logits[id] += bias;
  }
  if (rules.repetition_penalty != 1.0f) {
    for (int32_t id : prompt_) {
      if (in_range(logits, id)) logits[id] = repeat_penalized(logits[id], rules.repetition_penalty);
    }
    for (const auto& [id, n] : counts_) {
      if (in_range(logits, id) && !std::ranges::binary_search(prompt_, id)) {
        logits[id] = repeat_penalized(logits[id], rules.repetition_penalty);
      }
    }
  }
  for (const auto& [id, n] : counts_) {
    if (in_range(logits, id)) {
      logits[id] -= rules.frequency_penalty * static_cast<float>(n) + rules.presence_penalty;
    }
  }
}

}  // namespace fpa
