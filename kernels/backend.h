// A backend runs the decoder over a batch, reading and extending the paged KV cache.
// The CPU backend (kernels/cpu) is always built; the CUDA backend (kernels/cuda) when nvcc is.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/batch_item.h"
#include "cache/kv_cache.h"
#include "model/model.h"

namespace fpa {

// Where a forward's wall time went, seconds added up per phase of its layers, so that what bounds
// a step is read from the step itself (bench/decode_bench.cc prints it beside each phase's
// bytes). The CPU backend fills it.
struct StepPhases {
  double project = 0;  // the input's norm and the q, k, v and field projections
  double field = 0;    // the field's walk over the new tokens
  double pages = 0;    // each stream's page list and exclusion threshold (the cache's look-ups)
  double attend = 0;   // attention over the cached pages
  double cache = 0;    // eviction, the new keys' insertion, compaction
  double output = 0;   // the output gate and projection
  double mlp = 0;      // the MLP block
  double logits = 0;   // the final norm and the lm_head
};

// Every phase with its name, for whoever prints or adds them up.
inline constexpr std::array<std::pair<std::string_view, double StepPhases::*>, 8> kStepPhases{{
    {"project", &StepPhases::project},
    {"field", &StepPhases::field},
    {"pages", &StepPhases::pages},
    {"attend", &StepPhases::attend},
    {"cache", &StepPhases::cache},
    {"output", &StepPhases::output},
    {"mlp", &StepPhases::mlp},
    {"logits", &StepPhases::logits},
}};

// Optional outputs for tests, debugging and benchmarks.
struct ForwardTrace {
  bool all_logits = false;  // logits of every token, not only the last one
  std::vector<std::vector<float>>* layer_outputs = nullptr;  // [layer] -> [tokens][d_model]
  StepPhases* phases = nullptr;                              // added to, where the backend times
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether this backend can run a sequence under `policy`; the runner asks before starting one,
  // so an unsupported request fails alone instead of failing every batch it joins.
  virtual absl::Status check_policy(const cache::PolicyConfig& /*policy*/) const {
    return absl::OkStatus();
  }
  // Runs the model over every item: computes the field, evicts per the sequence's policy, inserts
  // the new keys, attends, and writes each item's last-token logits to logits[i * vocab_size]
  // (every token's, item after item, with trace->all_logits). Fails with ResourceExhausted before
  // changing anything when the cache cannot take the batch.
  virtual absl::Status forward(std::span<const cache::BatchItem> items, std::span<float> logits,
                               ForwardTrace* trace = nullptr) = 0;
};

// The CPU backend's projection weights: the model's float32, or bf16 copies made at start (half
// the bytes a step reads; needs AVX512-BF16, else FailedPrecondition), or int8 with per-row
// scales (a quarter; needs AVX512-VNNI, kernels/cpu/int8_linear.h). The field's projections
// stay float32 whatever the choice: the eviction decisions hang on them.
enum class CpuWeights { kF32, kBf16, kInt8 };

// "bf16" -> kBf16, "int8" -> kInt8, anything else kF32 (the flags' parsers check the names).
CpuWeights cpu_weights_named(std::string_view name);

absl::StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const Model& model, cache::KvCache& cache,
                                                          int threads,
                                                          CpuWeights weights = CpuWeights::kF32);
// NotFound / Unavailable when no CUDA device (or no CUDA build); never crashes without a driver.
absl::StatusOr<std::unique_ptr<Backend>> make_cuda_backend(const Model& model,
                                                           cache::KvCache& cache);
bool cuda_device_available();

}  // namespace fpa
