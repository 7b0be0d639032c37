// Decode throughput of the CPU backend: a batch of sequences prefilled to a context length, then
// timed decode steps (every sequence one token per step), with FPA eviction on or off. Prints
// one JSON line per configuration; bench/decode_compare.py runs it side by side with the
// PyTorch reference.
//   build-x/bench/fpa-decode-bench --model models/fpa-tiny --batch 1,8,32 --context 256,2048
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "bench/cpu_stolen.h"
#include "bench/decode_tokens.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/formats.h"
#include "nlohmann/json.hpp"
#include "server/engine/model_runner.h"

ABSL_FLAG(std::string, model, "models/fpa-tiny", "model directory");
ABSL_FLAG(std::vector<std::string>, batch, std::vector<std::string>({"1", "8", "32"}),
          "batch sizes");
ABSL_FLAG(std::vector<std::string>, context, std::vector<std::string>({"256", "2048"}),
          "prompt lengths before the timed steps");
ABSL_FLAG(std::vector<std::string>, evict, std::vector<std::string>({"on", "off"}),
          "on = fpa eviction at tau, off = full cache");
ABSL_FLAG(int, steps, 64, "timed decode steps");
ABSL_FLAG(int, windows, 4, "timing windows the steps are split into (the fastest is reported)");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = all cores)");
ABSL_FLAG(float, tau, 0.0f, "eviction threshold (0 = the model's)");
ABSL_FLAG(int, prefill_chunk, 256, "prompt tokens per prefill step");
ABSL_FLAG(std::string, cpu_weights, "f32",
          "f32 | bf16 | int8 | auto: the CPU backend's projection weights (auto as fpa-serve's)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "f32 | bf16 | auto: the KV cache pages' keys and values (auto as fpa-serve's)");

namespace fpa::bench {
namespace {

struct Config {
  int batch, context;
  bool evict;
};

std::vector<int> ints(const std::vector<std::string>& list) {
  std::vector<int> out;
  for (const std::string& s : list) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      std::cerr << "not a positive integer: " << s << "\n";
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

void check(const absl::Status& s) {
  if (!s.ok()) {
    std::cerr << s << "\n";
    std::exit(1);
  }
}

// Milliseconds per decode step of each phase of the backend's layers (kernels/backend.h).
nlohmann::json phase_ms(const StepPhases& p, int steps) {
  nlohmann::json out;
  for (const auto& [name, phase] : kStepPhases) out[std::string(name)] = p.*phase * 1e3 / steps;
  return out;
}

// Prefills every sequence to cfg.context tokens (all sequences in each step, in chunks).
void prefill(ModelRunner& runner, const std::vector<cache::SeqId>& seqs, int context,
             std::vector<std::vector<int32_t>>& tokens) {
  const int v = runner.model().config().vocab_size;
  const int chunk = absl::GetFlag(FLAGS_prefill_chunk);
  std::vector<float> logits(seqs.size() * v);
  for (int at = 0; at < context; at += chunk) {
    std::vector<cache::BatchItem> inputs;
    for (size_t b = 0; b < seqs.size(); ++b) {
      inputs.push_back(
          {seqs[b], std::span(tokens[b]).subspan(at, std::min(chunk, context - at)), at});
    }
    check(runner.step(inputs, logits));
  }
}

nlohmann::json run(const Model& model, const Config& cfg, const CpuFormats& formats) {
  const ModelConfig& c = model.config();
  const int steps = absl::GetFlag(FLAGS_steps);
  const cache::CacheShape shape{c.n_layers, c.n_heads, c.head_dim, 16,
                                formats.kv == "bf16" ? 2 : 4};
  const int64_t pages = static_cast<int64_t>(cfg.batch) * c.n_layers * c.n_heads *
                        ((cfg.context + steps) / shape.page_slots + 2);
  auto cache = cache::KvCache::create(shape, pages);
  check(cache.status());
  auto backend = make_cpu_backend(model, **cache, absl::GetFlag(FLAGS_threads),
                                  cpu_weights_named(formats.weights));
  check(backend.status());
  ModelRunner runner(model, **cache, *std::move(backend));
  const float tau = absl::GetFlag(FLAGS_tau) > 0 ? absl::GetFlag(FLAGS_tau) : c.tau;
  const cache::PolicyConfig policy{.policy = cfg.evict ? cache::Policy::kFpa : cache::Policy::kNone,
                                   .tau = tau};
  std::vector<cache::SeqId> seqs;
  std::vector<std::vector<int32_t>> tokens(cfg.batch);
  for (int b = 0; b < cfg.batch; ++b) {
    seqs.push_back(*runner.start(policy));
    for (int t = 0; t < cfg.context + steps; ++t) {
      tokens[b].push_back(
          bench_token(t < cfg.context ? 0 : b, t));  // one prompt, own continuations
    }
  }
  const auto p0 = std::chrono::steady_clock::now();
  prefill(runner, seqs, cfg.context, tokens);
  const double prefill_secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
  std::vector<float> logits(cfg.batch * static_cast<size_t>(c.vocab_size));
  // The timed steps run in windows; the fastest window is the figure that a busy machine
  // disturbs least (the rate over all steps is printed too).
  const int windows = std::max(1, std::min(absl::GetFlag(FLAGS_windows), steps));
  double best = 1e300, total = 0.0;
  StepPhases phases;
  const std::clock_t cpu0 = std::clock();
  const CpuStolen stolen;
  for (int w = 0, i = 0; w < windows; ++w) {
    const int begin = i, end = steps * (w + 1) / windows;
    const auto t0 = std::chrono::steady_clock::now();
    for (; i < end; ++i) {
      std::vector<cache::BatchItem> inputs;
      for (int b = 0; b < cfg.batch; ++b) {
        inputs.push_back(
            {seqs[b], std::span(tokens[b]).subspan(cfg.context + i, 1), cfg.context + i});
      }
      check(runner.step(inputs, logits, /*all_logits=*/false, &phases));
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, secs / (end - begin));
    total += secs;
  }
  const double cpu_secs = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  double live = 0, full = 0, slots = 0;
  for (cache::SeqId s : seqs) {
    const cache::SequenceStats stats = (*cache)->sequence_stats(s);
    live += stats.live_keys;
    full += stats.full_keys;
    slots += stats.pages * (*cache)->shape().page_slots;
  }
  return {{"impl", "cpp"},
          {"batch", cfg.batch},
          {"context", cfg.context},
          {"evict", cfg.evict},
          {"cpu_weights", formats.weights},
          {"kv_dtype", formats.kv},
          {"tau", tau},
          {"steps", steps},
          {"seconds", total},
          {"cpu_seconds", cpu_secs},
          {"cpu_stolen", stolen.fraction()},
          {"tokens_per_s", cfg.batch / best},
          {"tokens_per_s_mean", cfg.batch * steps / total},
          {"live_fraction", live / full},
          {"page_fill", live / slots},
          {"prefill_tokens_per_s", cfg.batch * cfg.context / prefill_secs},
          {"phase_ms", phase_ms(phases, steps)}};
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) {
  fpa::cpu::restart_for_blas_kernels(argv);
  absl::ParseCommandLine(argc, argv);
  auto loaded = fpa::load_for_cpu(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_cpu_weights),
                                  absl::GetFlag(FLAGS_kv_dtype));
  fpa::bench::check(loaded.status());
  const fpa::Model& model = *loaded->model;
  for (int context : fpa::bench::ints(absl::GetFlag(FLAGS_context))) {
    for (int batch : fpa::bench::ints(absl::GetFlag(FLAGS_batch))) {
      for (const std::string& e : absl::GetFlag(FLAGS_evict)) {
        const fpa::bench::Config cfg{batch, context, e == "on"};
        std::cout << fpa::bench::run(model, cfg, loaded->formats).dump() << std::endl;
      }
    }
  }
  return 0;
}
