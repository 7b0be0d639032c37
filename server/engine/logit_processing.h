// vLLM's logit processing before sampling, in vLLM's order: allowed_token_ids masks every other
// id, bad_words mask the id that would complete one, min_tokens masks the end tokens,
// logit_bias adds, then the penalties: repetition (over prompt and output, Hugging Face's rule:
// a seen token's positive logit is divided by it, a negative one multiplied), frequency and
// presence (OpenAI's rule, over the output only: logit -= frequency x count + presence x seen).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

namespace fpa {

struct LogitRules {
  float repetition_penalty = 1.0f;  // 1 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // token id, added to its logit
  int min_tokens = 0;                     // until this many are out, end_ids cannot be sampled
  std::vector<int32_t> end_ids = {};      // EOS (unless ignored) and the stop token ids
  std::vector<int32_t> allowed_ids = {};  // sorted, unique; empty = every id
  std::vector<std::vector<int32_t>> bad_words = {};  // id sequences, none empty

  bool penalizes() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// What the penalties need of the sequence so far.
class LogitHistory {
 public:
  LogitHistory(const LogitRules& rules, std::span<const int32_t> prompt);
  void record(int32_t token);
  int generated() const { return generated_; }
  // The rules applied to `logits` in place.
  void apply(const LogitRules& rules, std::span<float> logits) const;

 private:
  std::vector<int32_t> prompt_;    // sorted, unique: seen for repetition_penalty
  std::map<int32_t, int> counts_;  // output token -> times sampled
  std::vector<int32_t> output_;    // the output so far, kept only for bad_words
  int generated_ = 0;
  bool counts_output_ = false;  // only penalties read counts_
  bool keeps_output_ = false;   // only bad_words read output_
};

}  // namespace fpa
