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

constexpr float kMasked = -std::numeric_limits<float>::infinity();

void mask_all_but(std::span<const int32_t> allowed, std::span<float> logits) {
  std::vector<float> kept;
  kept.reserve(allowed.size());
  for (int32_t id : allowed) kept.push_back(in_range(logits, id) ? logits[id] : kMasked);
  std::ranges::fill(logits, kMasked);
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (in_range(logits, allowed[i])) logits[allowed[i]] = kept[i];
  }
}

// The last id of each bad word whose other ids end the output.
void mask_bad_words(const std::vector<std::vector<int32_t>>& words, std::span<const int32_t> output,
                    std::span<float> logits) {
  for (const std::vector<int32_t>& word : words) {
    const size_t before = word.size() - 1;
    if (before > output.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, output.end() - static_cast<ptrdiff_t>(before)) &&
        in_range(logits, word.back())) {
      logits[word.back()] = kMasked;
    }
  }
}

}  // namespace

LogitHistory::LogitHistory(const LogitRules& rules, std::span<const int32_t> prompt)
    : counts_output_(rules.penalizes()), keeps_output_(!rules.bad_words.empty()) {
  // Only repetition_penalty looks at the prompt; the others keep no copy of it.
  if (rules.repetition_penalty == 1.0f) return;
  prompt_.assign(prompt.begin(), prompt.end());
  std::ranges::sort(prompt_);
  prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
}

void LogitHistory::record(int32_t token) {
  if (counts_output_) ++counts_[token];
  if (keeps_output_) output_.push_back(token);
  ++generated_;
}

void LogitHistory::apply(const LogitRules& rules, std::span<float> logits) const {
  if (!rules.allowed_ids.empty()) mask_all_but(rules.allowed_ids, logits);
  mask_bad_words(rules.bad_words, output_, logits);
  if (generated_ < rules.min_tokens) {
    for (int32_t id : rules.end_ids) {
      if (in_range(logits, id)) logits[id] = kMasked;
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
