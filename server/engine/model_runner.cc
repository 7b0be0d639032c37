#include "server/engine/model_runner.h"

#include <algorithm>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "model/status_macros.h"

namespace fpa {

ModelRunner::ModelRunner(const Model& model, cache::KvCache& cache,
                         std::unique_ptr<Backend> backend)
    : model_(model), cache_(cache), backend_(std::move(backend)) {}

absl::StatusOr<cache::SeqId> ModelRunner::start(const cache::PolicyConfig& policy) {
  if (absl::Status st = backend_->check_policy(policy); !st.ok()) return st;
  return cache_.add_sequence(policy);
}

absl::Status ModelRunner::step(std::span<const cache::BatchItem> items, std::span<float> logits,
                               bool all_logits, StepPhases* phases) {
  absl::Cleanup unreserve = [&] {
    for (const cache::BatchItem& in : items) cache_.unreserve(in.seq);
  };
  for (const cache::BatchItem& in : items) {
    if (!cache_.contains(in.seq)) {
      return absl::NotFoundError(absl::StrCat("model runner: unknown sequence ", in.seq));
    }
    if (in.start_pos != position(in.seq)) {
      return absl::InvalidArgumentError(absl::StrCat("model runner: sequence ", in.seq, " is at ",
                                                     position(in.seq), ", the item starts at ",
                                                     in.start_pos));
    }
    if (!cache_.reserve(in.seq, static_cast<int>(in.tokens.size()))) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache exhausted: the step needs more pages than the ",
                       cache_.free_pages(), " free ones"));
    }
  }
  ForwardTrace trace{.all_logits = all_logits, .phases = phases};
  return backend_->forward(items, logits, all_logits || phases != nullptr ? &trace : nullptr);
}

int32_t ModelRunner::position(cache::SeqId seq) const {
  return cache_.contains(seq) ? static_cast<int32_t>(cache_.length(seq)) : -1;
}

void ModelRunner::finish(cache::SeqId seq) { cache_.release(seq); }

// The returned tokens are the sampled ones, EOS included when it ended the generation.
absl::StatusOr<std::vector<int32_t>> ModelRunner::generate(std::span<const int32_t> prompt,
                                                           const SamplingParams& sampling,
                                                           int max_new_tokens,
                                                           const cache::PolicyConfig& policy,
                                                           int prefill_chunk) {
  if (prompt.empty() || prefill_chunk <= 0 || max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        "generate: needs a non-empty prompt, prefill_chunk > 0 and max_new_tokens >= 0");
  }
  cache::PolicyConfig with_prompt = policy;
  with_prompt.prompt_tokens = static_cast<int64_t>(prompt.size());
  absl::StatusOr<cache::SeqId> seq = start(with_prompt);
  if (!seq.ok()) return seq.status();
  absl::Cleanup done = [&] { finish(*seq); };
  std::vector<float> logits(model_.config().vocab_size);
  for (size_t at = 0; at < prompt.size(); at += prefill_chunk) {
    const size_t n = std::min(prompt.size() - at, static_cast<size_t>(prefill_chunk));
    const cache::BatchItem in{*seq, prompt.subspan(at, n), static_cast<int32_t>(at)};
    FPA_RETURN_IF_ERROR(step({&in, 1}, logits));
  }
  Sampler sampler(sampling);
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < max_new_tokens) {
    out.push_back(sampler.sample(logits));
    if (out.back() == model_.config().eos_id || static_cast<int>(out.size()) == max_new_tokens) {
      break;
    }
    const cache::BatchItem in{*seq, {&out.back(), 1}, position(*seq)};
    FPA_RETURN_IF_ERROR(step({&in, 1}, logits));
  }
  return out;
}

}  // namespace fpa
