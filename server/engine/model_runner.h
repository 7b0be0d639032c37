// The model runner: steps a batch of sequences through a backend, one prompt chunk or one decode
// token each. The scheduler (server/) drives it; it never blocks on anything but compute. A
// sequence's position is the cache's (KvView::length): nothing here keeps a second record.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/batch_item.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "server/engine/sampler.h"

namespace fpa {

class ModelRunner {
 public:
  ModelRunner(const Model& model, cache::KvCache& cache, std::unique_ptr<Backend> backend);

  const Model& model() const { return model_; }
  cache::KvCache& cache() { return cache_; }
  std::string_view backend_name() const { return backend_->name(); }

  // Whether the backend runs `policy` (InvalidArgument or Unimplemented naming why not).
  absl::Status check_policy(const cache::PolicyConfig& policy) const {
    return backend_->check_policy(policy);
  }
  absl::StatusOr<cache::SeqId> start(const cache::PolicyConfig& policy);
  // The planner's call before a step (KvCache::reserve): false when the pool cannot promise the
  // pages appending n_tokens to `seq` may take; the caller preempts or defers it.
  bool reserve(cache::SeqId seq, int n_tokens) { return cache_.reserve(seq, n_tokens); }
  // Appends each item's tokens at its sequence's current position (InvalidArgument when its
  // start_pos is not that) and writes the logits of its last token to logits[i * vocab_size]
  // (with all_logits, of every token, item after item). Reserves what the caller did not, and
  // hands back every reservation afterwards. ResourceExhausted (nothing changed) when the pool
  // cannot take the whole step. With `phases`, the backend adds where the step's time went.
  absl::Status step(std::span<const cache::BatchItem> items, std::span<float> logits,
                    bool all_logits = false, StepPhases* phases = nullptr);
  int32_t position(cache::SeqId seq) const;
  void finish(cache::SeqId seq);  // frees every page of the sequence at once

  // Solo generation without batching (tests, benchmarks, the reference for batched output):
  // prefill in chunks of `prefill_chunk`, then sample until max_new_tokens or EOS. The policy's
  // prompt_tokens is the prompt's length.
  absl::StatusOr<std::vector<int32_t>> generate(std::span<const int32_t> prompt,
                                                const SamplingParams& sampling, int max_new_tokens,
                                                const cache::PolicyConfig& policy,
                                                int prefill_chunk = 256);

 private:
  const Model& model_;
  cache::KvCache& cache_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace fpa
