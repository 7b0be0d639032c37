// A generation request as the scheduler sees it, and the sink it reports to. The gRPC layer
// builds one from a validated GenerateRequest; the scheduler thread is the only one that calls
// the sink, and it calls on_finish exactly once, last.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cache/kv_cache.h"
#include "server/engine/sampler.h"

namespace fpa::server {

using Clock = std::chrono::steady_clock;

enum class FinishReason { kNone, kLength, kEos, kStop };

struct GenerationParams {
  std::vector<int32_t> prompt;
  int max_new_tokens = 64;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool logprobs = false;  // sampling.top_logprobs alternatives with each
  // Score the prompt: a first chunk (TokenChunk::prompt) carries its tokens' log-probabilities.
  bool prompt_logprobs = false;
  int prompt_top_logprobs = 0;  // alternatives with each prompt token's score
  bool ignore_eos = false;
  cache::PolicyConfig policy;
};

// The tokens of one decode step (or of the prefill's last chunk) for one request; or, once,
// before them, the prompt scored (prompt_logprobs).
struct TokenChunk {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;                 // empty unless requested
  std::vector<std::vector<TokenLogprob>> top;  // with logprobs: top_logprobs alternatives each
  std::string text;                            // complete UTF-8 characters only
  // The prompt's tokens: logprobs[0] is NaN (nothing predicts the first), text is empty, and
  // ranks[i] is token i's rank (1 = likeliest) among the vocabulary.
  bool prompt = false;
  std::vector<int32_t> ranks;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  int64_t peak_live_keys = 0;
  double live_fraction = 0;
  int64_t cache_bytes_held = 0;
  int64_t cache_bytes_full = 0;
  int32_t preemptions = 0;        // times the scheduler preempted the request
  int64_t recomputed_tokens = 0;  // tokens prefilled again after preemptions
  int64_t cached_tokens = 0;      // prompt tokens the prefix cache held: not prefilled
};

struct Completion {
  absl::Status status;
  FinishReason reason = FinishReason::kNone;
  Usage usage;
  std::string text_tail;  // a trailing incomplete character, flushed as U+FFFD
};

class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void on_tokens(TokenChunk chunk) = 0;
  virtual void on_finish(Completion done) = 0;
};

struct Request {
  GenerationParams params;
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();
  RequestSink* sink = nullptr;

  // Called by the transport when the client goes away; the scheduler frees the pages.
  void cancel() {
    Clock::rep none = kNotCancelled;
    cancelled_at_.compare_exchange_strong(none, Clock::now().time_since_epoch().count());
  }
  bool cancelled() const { return cancelled_at_.load() != kNotCancelled; }
  Clock::time_point cancelled_at() const {
    return Clock::time_point(Clock::duration(cancelled_at_.load()));
  }

 private:
  static constexpr Clock::rep kNotCancelled = std::numeric_limits<Clock::rep>::max();
  std::atomic<Clock::rep> cancelled_at_{kNotCancelled};
};

}  // namespace fpa::server
