// Per-token perplexity of a model through the CPU backend in a chosen weight / KV format, for
// measuring what a compact format costs in accuracy (issue 26; bench/RESULTS.md). The windows
// match train/eval_passkey.py's perplexity: non-overlapping windows of `window` predictions,
// each a fresh sequence, here stepped one token at a time (the decode path serving runs), a
// batch of windows per step.
//
//   build/bench/fpa-perplexity --model models/fpa-v2 --tokens heldout.txt --cpu_weights int8
//
// --tokens: whitespace-separated token ids; the held-out set of train/eval_passkey.py is
//   /usr/bin/python3 -c "import sys; sys.path.insert(0, 'train'); from data import heldout_tokens;
//   print(*heldout_tokens())" > heldout.txt
// (its last, partial window is left out here).
// Prints one JSON line: ppl, tokens scored, the formats, and the live-key fraction at the end.
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/formats.h"
#include "nlohmann/json.hpp"
#include "server/engine/model_runner.h"

ABSL_FLAG(std::string, model, "models/fpa-v2", "model directory");
ABSL_FLAG(std::string, tokens, "", "file of whitespace-separated token ids");
ABSL_FLAG(int, window, 0, "predictions per window; 0 = the model's train_len");
ABSL_FLAG(int, batch, 8, "windows stepped together");
ABSL_FLAG(bool, evict, false, "FPA eviction at the model's tau (default: full cache)");
ABSL_FLAG(std::string, cpu_weights, "f32", "f32 | bf16 | int8 | auto");
ABSL_FLAG(std::string, kv_dtype, "f32", "f32 | bf16 | auto");
ABSL_FLAG(int, threads, 2, "CPU backend threads");

namespace fpa::bench {
namespace {

void check(const absl::Status& s) {
  if (!s.ok()) {
    std::cerr << "fpa-perplexity: " << s << "\n";
    std::exit(1);
  }
}

// -log softmax(logits)[target], in double.
double nll(std::span<const float> logits, int32_t target) {
  double m = logits[0], sum = 0;
  for (float x : logits) m = std::max(m, double{x});
  for (float x : logits) sum += std::exp(x - m);
  return std::log(sum) + m - logits[target];
}

// The summed negative log-likelihood of windows [w0, w0 + n) and the live-key fraction at
// their end.
std::pair<double, double> score(ModelRunner& runner, const std::vector<int32_t>& tokens, int w0,
                                int n, int window, const cache::PolicyConfig& policy) {
  const int vocab = runner.model().config().vocab_size;
  std::vector<cache::SeqId> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back(*runner.start(policy));
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  double sum = 0;
  for (int t = 0; t < window; ++t) {
    std::vector<cache::BatchItem> inputs;
    for (int i = 0; i < n; ++i) {
      inputs.push_back({seqs[i], std::span(tokens).subspan((w0 + i) * window + t, 1), t});
    }
    check(runner.step(inputs, logits));
    for (int i = 0; i < n; ++i) {
      sum += nll(std::span(logits).subspan(static_cast<size_t>(i) * vocab, vocab),
                 tokens[(w0 + i) * window + t + 1]);
    }
  }
  double live = 0, full = 0;
  for (cache::SeqId s : seqs) {
    live += runner.cache().sequence_stats(s).live_keys;
    full += runner.cache().sequence_stats(s).full_keys;
    runner.finish(s);
  }
  return {sum, live / full};
}

int run() {
  auto loaded = load_for_cpu(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_cpu_weights),
                             absl::GetFlag(FLAGS_kv_dtype));
  check(loaded.status());
  const Model& model = *loaded->model;
  const ModelConfig& c = model.config();
  std::ifstream in(absl::GetFlag(FLAGS_tokens));
  const std::vector<int32_t> tokens{std::istream_iterator<int32_t>(in), {}};
  const int window = absl::GetFlag(FLAGS_window) > 0 ? absl::GetFlag(FLAGS_window) : c.train_len;
  const int windows = tokens.empty() ? 0 : static_cast<int>((tokens.size() - 1) / window);
  if (windows == 0) check(absl::InvalidArgumentError("fewer tokens than one window"));
  const int batch = std::max(1, absl::GetFlag(FLAGS_batch));
  const cache::CacheShape shape{c.n_layers, c.n_heads, c.head_dim, 16,
                                loaded->formats.kv == "bf16" ? 2 : 4};
  auto cache = cache::KvCache::create(
      shape, static_cast<int64_t>(batch) * c.n_layers * c.n_heads * (window / 16 + 2));
  check(cache.status());
  auto backend = make_cpu_backend(model, **cache, absl::GetFlag(FLAGS_threads),
                                  cpu_weights_named(loaded->formats.weights));
  check(backend.status());
  ModelRunner runner(model, **cache, *std::move(backend));
  const cache::PolicyConfig policy{
      .policy = absl::GetFlag(FLAGS_evict) ? cache::Policy::kFpa : cache::Policy::kNone,
      .tau = c.tau};
  double sum = 0, live = 0;
  for (int w0 = 0; w0 < windows; w0 += batch) {
    const int n = std::min(batch, windows - w0);
    const auto [s, l] = score(runner, tokens, w0, n, window, policy);
    sum += s;
    live += l * n;
  }
  const double count = static_cast<double>(windows) * window;
  std::cout << nlohmann::json{{"model", absl::GetFlag(FLAGS_model)},
                              {"cpu_weights", loaded->formats.weights},
                              {"kv_dtype", loaded->formats.kv},
                              {"evict", absl::GetFlag(FLAGS_evict)},
                              {"window", window},
                              {"tokens", count},
                              {"ppl", std::exp(sum / count)},
                              {"live_fraction", live / windows}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) {
  fpa::cpu::restart_for_blas_kernels(argv);
  absl::ParseCommandLine(argc, argv);
  return fpa::bench::run();
}
