// fpa-generate: one prompt through ModelRunner::generate (no scheduler, no batching), printed as
// JSON {"tokens": [...]}. The server's integration tests compare the daemon's output with it.
//
//   fpa-generate --model DIR (--prompt TEXT | --tokens 256,72,105) [--max-new-tokens N]
//                [--temperature X --top-k N --top-p X --seed N] [--policy fpa --tau X]
//                [--prefill-chunk N] [--cache-pages N]
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/engine/model_runner.h"

namespace {

int fail(const std::string& why) {
  std::cerr << "fpa-generate: " << why << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"max-new-tokens", "32"}, {"temperature", "0"},   {"top-k", "0"},
      {"top-p", "1"},           {"seed", "0"},          {"policy", "fpa"},
      {"prefill-chunk", "256"}, {"cache-pages", "4096"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0) return fail("unexpected argument " + flag);
    args[flag.substr(2)] = argv[i + 1];
  }
  if (!args.count("model")) return fail("--model is required");

  auto model = fpa::Model::load(args["model"]);
  if (!model.ok()) return fail(std::string(model.status().message()));
  const fpa::ModelConfig& c = (*model)->config();

  std::vector<int32_t> prompt;
  if (args.count("tokens")) {
    for (absl::string_view t : absl::StrSplit(args["tokens"], ',')) {
      int32_t id;
      if (!absl::SimpleAtoi(t, &id)) return fail("--tokens: bad id");
      prompt.push_back(id);
    }
  } else {
    prompt = (*model)->tokenizer().encode(args["prompt"]);
  }

  fpa::SamplingParams sampling;
  int max_new = 0, chunk = 0;
  int64_t pages = 0;
  fpa::cache::PolicyConfig policy;
  policy.tau = c.tau;
  auto policy_kind = fpa::cache::parse_policy(args["policy"]);
  if (!policy_kind.ok()) return fail(std::string(policy_kind.status().message()));
  policy.policy = *policy_kind;
  if (!absl::SimpleAtoi(args["max-new-tokens"], &max_new) ||
      !absl::SimpleAtof(args["temperature"], &sampling.temperature) ||
      !absl::SimpleAtoi(args["top-k"], &sampling.top_k) ||
      !absl::SimpleAtof(args["top-p"], &sampling.top_p) ||
      !absl::SimpleAtoi(args["seed"], &sampling.seed) ||
      !absl::SimpleAtoi(args["prefill-chunk"], &chunk) ||
      !absl::SimpleAtoi(args["cache-pages"], &pages) ||
      (args.count("tau") && !absl::SimpleAtof(args["tau"], &policy.tau))) {
    return fail("bad numeric flag");
  }

  auto kv = fpa::cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16}, pages);
  if (!kv.ok()) return fail(std::string(kv.status().message()));
  auto backend = fpa::make_cpu_backend(**model, **kv, 1);
  if (!backend.ok()) return fail(std::string(backend.status().message()));
  fpa::ModelRunner runner(**model, **kv, std::move(*backend));
  auto tokens = runner.generate(prompt, sampling, max_new, policy, chunk);
  if (!tokens.ok()) return fail(std::string(tokens.status().message()));
  std::cout << nlohmann::json{{"tokens", *tokens}}.dump() << "\n";
  return 0;
}
