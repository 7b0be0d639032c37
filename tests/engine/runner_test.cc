// The model runner over the CPU backend and a real paged cache: batched decode equals solo
// generation, an exhausted pool is a clean error with nothing changed, samplers are seeded.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <numeric>

#include "kernels/cpu/bf16_linear.h"
#include "kernels/cpu/int8_linear.h"
#include "model/bf16.h"
#include "server/engine/model_runner.h"
#include "tests/engine/model_files.h"

namespace fpa {
namespace {

class RunnerTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { build(4096); }

  void build(int64_t pages) {
    runner_.reset();
    testing::write_model(dir_.path(), testing::random_model(GetParam(), "free", 5));
    auto model = Model::load(dir_.path());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    const ModelConfig& c = model_->config();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 4}, pages);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto backend = make_cpu_backend(*model_, *cache_, 2);
    ASSERT_TRUE(backend.ok()) << backend.status();
    runner_ = std::make_unique<ModelRunner>(*model_, *cache_, *std::move(backend));
  }

  static std::vector<int32_t> prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 37 + salt * 11) % 256;
    p[0] = 256;
    return p;
  }

  static int32_t argmax(std::span<const float> logits) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

  testing::TempDir dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
  const cache::PolicyConfig fpa_{.policy = cache::Policy::kFpa, .tau = 4.0f};
};

// Three sequences at different positions, stepped together (one still prefilling while the
// others decode), give exactly the tokens each gets alone.
TEST_P(RunnerTest, BatchedStepsEqualSoloGeneration) {
  const int kNew = 12;
  const std::vector<std::vector<int32_t>> prompts = {prompt(5, 1), prompt(23, 2), prompt(40, 3)};
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : prompts) {
    auto out = runner_->generate(p, {}, kNew, fpa_, /*prefill_chunk=*/16);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), static_cast<size_t>(kNew));
    solo.push_back(*out);
  }
  EXPECT_EQ(cache_->stats().pages_in_use, 0);  // generate releases its sequence

  const int v = model_->config().vocab_size;
  std::vector<cache::SeqId> seqs;
  std::vector<size_t> fed(3, 0);  // prompt tokens consumed
  std::vector<std::vector<int32_t>> got(3);
  for (int i = 0; i < 3; ++i) seqs.push_back(*runner_->start(fpa_));
  while (got[0].size() < kNew || got[1].size() < kNew || got[2].size() < kNew) {
    std::vector<cache::BatchItem> inputs;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i) {
      if (got[i].size() >= kNew) continue;
      if (fed[i] < prompts[i].size()) {  // prefill in chunks of 16, like generate
        const size_t n = std::min<size_t>(16, prompts[i].size() - fed[i]);
        inputs.push_back(
            {seqs[i], std::span(prompts[i]).subspan(fed[i], n), runner_->position(seqs[i])});
        fed[i] += n;
      } else {
        inputs.push_back({seqs[i], std::span(got[i]).last(1), runner_->position(seqs[i])});
      }
      who.push_back(i);
    }
    std::vector<float> logits(inputs.size() * v);
    ASSERT_TRUE(runner_->step(inputs, logits).ok());
    for (size_t k = 0; k < who.size(); ++k) {
      const int i = who[k];
      if (fed[i] == prompts[i].size())
        got[i].push_back(argmax(std::span(logits).subspan(k * v, v)));
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i], solo[i]) << "sequence " << i;
    EXPECT_EQ(runner_->position(seqs[i]), static_cast<int32_t>(prompts[i].size() + kNew - 1));
    runner_->finish(seqs[i]);
    EXPECT_EQ(runner_->position(seqs[i]), -1);
  }
  EXPECT_EQ(cache_->stats().pages_in_use, 0);
}

// The phases a step's time is told in (what decode_bench prints to find a step's bound) are each
// timed, add up, and hold no more than the step's wall time.
TEST_P(RunnerTest, StepPhasesAddUpWithinTheStep) {
  const cache::SeqId seq = *runner_->start(fpa_);
  const std::vector<int32_t> p = prompt(40, 4);
  std::vector<float> logits(model_->config().vocab_size);
  StepPhases phases;
  double wall = 0, before = 0;
  for (int step = 0; step < 3; ++step) {
    const auto tokens = step == 0 ? std::span(p) : std::span(p).subspan(step, 1);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(runner_
                    ->step(std::vector<cache::BatchItem>{{seq, tokens, runner_->position(seq)}},
                           logits, /*all_logits=*/false, &phases)
                    .ok());
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double sum = 0;
    for (const auto& [name, phase] : kStepPhases) sum += phases.*phase;
    EXPECT_GT(sum, before) << "step " << step;  // added to, not reset
    EXPECT_LE(sum, wall) << "step " << step;
    before = sum;
  }
  for (const auto& [name, phase] : kStepPhases) EXPECT_GT(phases.*phase, 0.0) << name;
}

TEST_P(RunnerTest, ExhaustedPoolIsACleanErrorAndNothingChanges) {
  const int64_t streams =
      static_cast<int64_t>(model_->config().n_layers) * model_->config().n_heads;
  build(streams * 3);  // three pages (12 keys) per stream
  const ModelConfig& c = model_->config();
  const cache::PolicyConfig full{.policy = cache::Policy::kNone};
  const cache::SeqId a = *runner_->start(full);
  const std::vector<int32_t> p = prompt(10, 4);
  std::vector<float> logits(c.vocab_size), before(c.vocab_size);
  ASSERT_TRUE(runner_->step(std::vector<cache::BatchItem>{{a, p}}, logits).ok());
  const cache::SeqId b = *runner_->start(full);
  const std::vector<cache::BatchItem> too_big = {{b, p}};
  EXPECT_GT(cache_->pages_needed(b, 10), cache_->free_pages());
  EXPECT_FALSE(runner_->reserve(b, 10));
  const cache::CacheStats stats = cache_->stats();
  std::vector<float> untouched(c.vocab_size, 7.0f);
  const absl::Status s = runner_->step(too_big, untouched);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(runner_->position(b), 0);
  EXPECT_EQ(cache_->stats().pages_in_use, stats.pages_in_use);
  EXPECT_EQ(cache_->stats().live_slots, stats.live_slots);
  EXPECT_EQ(untouched, std::vector<float>(c.vocab_size, 7.0f));
  // A batch that fits only partly fails whole, too.
  const int32_t next = 65;
  const std::vector<cache::BatchItem> mixed = {{a, {&next, 1}, 10}, {b, p}};
  std::vector<float> two(2 * c.vocab_size);
  EXPECT_EQ(runner_->step(mixed, two).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(runner_->position(a), 10);
  EXPECT_EQ(cache_->stats().pages_reserved, 0);  // a failed step hands its reservations back
  runner_->finish(a);                            // after the scheduler preempts a, b fits
  EXPECT_TRUE(runner_->step(too_big, logits).ok());
  EXPECT_EQ(runner_->position(b), 10);
}

TEST_P(RunnerTest, BadInputIsAnErrorNotACrash) {
  const int v = model_->config().vocab_size;
  std::vector<float> logits(v), two(2 * v);
  const cache::SeqId a = *runner_->start(fpa_);
  const int32_t bad[] = {256, 400};
  EXPECT_EQ(runner_->step(std::vector<cache::BatchItem>{{a, bad}}, logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner_->step(std::vector<cache::BatchItem>{{a, {}}}, logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner_->step(std::vector<cache::BatchItem>{{a + 100, bad}}, logits).code(),
            absl::StatusCode::kNotFound);
  const int32_t ok[] = {256, 65};
  EXPECT_EQ(runner_->step(std::vector<cache::BatchItem>{{a, ok}, {a, ok}}, two).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      runner_->step(std::vector<cache::BatchItem>{{a, ok}}, std::span(logits).first(3)).code(),
      absl::StatusCode::kInvalidArgument);
  // An item must continue where its sequence stopped (the runner's check, before any backend's).
  EXPECT_EQ(runner_->step(std::vector<cache::BatchItem>{{a, ok, 3}}, logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner_->position(a), 0);
  EXPECT_FALSE(runner_->generate({}, {}, 4, fpa_).ok());
}

TEST_P(RunnerTest, SeededSamplingIsReproducible) {
  const SamplingParams p{.temperature = 1.0f, .top_k = 40, .top_p = 0.95f, .seed = 42};
  auto a = runner_->generate(prompt(9, 5), p, 16, fpa_);
  auto b = runner_->generate(prompt(9, 5), p, 16, fpa_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST_P(RunnerTest, HeuristicPoliciesKeepTheirBudget) {
  for (cache::Policy policy :
       {cache::Policy::kWindow, cache::Policy::kSinks, cache::Policy::kH2O}) {
    const cache::PolicyConfig cfg{.policy = policy, .budget_fraction = 0.25f, .min_budget = 8};
    const cache::SeqId s = *runner_->start(cfg);
    const std::vector<int32_t> p = prompt(64, 6);
    std::vector<float> logits(model_->config().vocab_size);
    for (int at = 0; at < 64; at += 16) {
      ASSERT_TRUE(
          runner_
              ->step(std::vector<cache::BatchItem>{{s, std::span(p).subspan(at, 16), at}}, logits)
              .ok());
    }
    const int32_t next = 66;
    ASSERT_TRUE(runner_->step(std::vector<cache::BatchItem>{{s, {&next, 1}, 64}}, logits).ok());
    const cache::SequenceStats st = cache_->sequence_stats(s);
    EXPECT_EQ(st.length, 65);
    // ceil(0.25 * 65) = 17 keys per stream at most.
    EXPECT_LE(st.live_keys, 17 * model_->config().n_layers * model_->config().n_heads)
        << cache::policy_name(policy);
    runner_->finish(s);
  }
}

// Attention mass of the keys a stream holds, by position.
std::map<int32_t, float> mass_by_position(cache::KvCache& cache, cache::SeqId s) {
  std::map<int32_t, float> out;
  for (int32_t id : cache.pages(s, 0, 0)) {
    const cache::PageView v = cache.page(id);
    for (int j = 0; j < cache.shape().page_slots; ++j) {
      if (v.pos[j] >= 0) out[v.pos[j]] = v.acc[j];
    }
  }
  return out;
}

// The kernels add each cached key's attention to its acc for h2o, which ranks by it, and leave
// acc alone for a policy that does not (one pass fewer over the keys).
TEST_P(RunnerTest, AttentionMassGrowsOnlyForH2o) {
  for (cache::Policy policy : {cache::Policy::kH2O, cache::Policy::kWindow}) {
    const cache::SeqId s = *runner_->start({.policy = policy, .budget_fraction = 0.5f});
    const std::vector<int32_t> p = prompt(40, 7);
    std::vector<float> logits(model_->config().vocab_size);
    ASSERT_TRUE(runner_->step(std::vector<cache::BatchItem>{{s, p}}, logits).ok());
    const std::map<int32_t, float> before = mass_by_position(*cache_, s);
    const int32_t next = 41;
    ASSERT_TRUE(runner_->step(std::vector<cache::BatchItem>{{s, {&next, 1}, 40}}, logits).ok());
    double grown = 0;
    for (const auto& [pos, acc] : mass_by_position(*cache_, s)) {
      if (auto it = before.find(pos); it != before.end()) grown += acc - it->second;
    }
    if (policy == cache::Policy::kH2O) {
      EXPECT_GT(grown, 0.01);
    } else {
      EXPECT_EQ(grown, 0.0);
    }
    runner_->finish(s);
  }
}

// snapkv and tova through the real kernels: every stream holds its budget after each step
// (snapkv: the whole prompt until its end); snapkv's keys get no mass before the prompt's last
// window, tova's hold one query's probabilities (summing to at most 1), never a running sum.
TEST_P(RunnerTest, SnapKvAndTovaHoldTheBudget) {
  for (cache::Policy policy : {cache::Policy::kSnapKV, cache::Policy::kTova}) {
    const cache::PolicyConfig config{.policy = policy,
                                     .budget_fraction = 0.5f,
                                     .snapkv_window = 8,
                                     .snapkv_pool = 3,
                                     .prompt_tokens = 40};
    const cache::SeqId s = *runner_->start(config);
    const std::vector<int32_t> p = prompt(40, 9);
    std::vector<float> logits(model_->config().vocab_size);
    std::vector<std::span<const int32_t>> steps = {
        std::span(p).first(16), std::span(p).subspan(16, 23), std::span(p).subspan(39)};
    const int32_t next = 7;
    for (int i = 0; i < 6; ++i) steps.push_back({&next, 1});
    for (std::span<const int32_t> tokens : steps) {
      ASSERT_TRUE(
          runner_->step(std::vector<cache::BatchItem>{{s, tokens, runner_->position(s)}}, logits)
              .ok());
      const int64_t length = cache_->length(s);
      const bool whole = policy == cache::Policy::kSnapKV && length < 40;
      const int64_t keep = whole ? length : std::max<int64_t>(8, (length + 1) / 2);
      EXPECT_EQ(cache_->sequence_stats(s).live_keys,
                std::min(length, keep) * model_->config().n_layers * model_->config().n_heads)
          << cache::policy_name(policy) << " at " << length;
      double mass = 0;
      for (const auto& [pos, acc] : mass_by_position(*cache_, s)) mass += acc;
      if (policy == cache::Policy::kSnapKV && length == 16) {
        EXPECT_EQ(mass, 0.0);
      }
      if (policy == cache::Policy::kTova) {
        EXPECT_LE(mass, 1.0 + 1e-5) << length;
      }
    }
    runner_->finish(s);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, RunnerTest, ::testing::Values("fpa", "fox", "softmax"));

// The projections of a random model stored as BF16, the rest as F32.
testing::ModelFiles bf16_projections(testing::ModelFiles f) {
  for (auto& [name, t] : f.tensors) {
    const bool projection =
        name.find("attn.w") != std::string::npos || name.find("mlp.w_") != std::string::npos;
    if (!projection) continue;
    std::vector<uint16_t> bits(t.bytes.size() / 4);
    to_bf16(reinterpret_cast<const float*>(t.bytes.data()), bits.size(), bits.data());
    t = {"BF16", t.shape, std::string(reinterpret_cast<const char*>(bits.data()), 2 * bits.size())};
  }
  return f;
}

// The projections as train/quantize_int8.py writes them: I8 values and F32 per-row scales.
testing::ModelFiles int8_projections(testing::ModelFiles f) {
  testing::TensorMap out;
  for (auto& [name, t] : f.tensors) {
    const bool projection =
        name.find("attn.w") != std::string::npos || name.find("mlp.w_") != std::string::npos;
    if (!projection) {
      out[name] = t;
      continue;
    }
    const int rows = static_cast<int>(t.shape[0]), cols = static_cast<int>(t.shape[1]);
    const auto* w = reinterpret_cast<const float*>(t.bytes.data());
    std::string q(t.bytes.size() / 4, '\0');
    std::vector<float> scale(rows);
    for (int r = 0; r < rows; ++r) {
      scale[r] = cpu::quantize_row(w + r * cols, cols, reinterpret_cast<int8_t*>(&q[r * cols]));
    }
    out[name] = {"I8", t.shape, q};
    out[name + ".scale"] = testing::f32_tensor({rows}, scale);
  }
  f.tensors = out;
  return f;
}

// Greedy tokens and every step's logits of one sequence: a prompt, then `steps` decode steps.
std::vector<float> generate(const Model& model, int steps, CpuWeights weights = CpuWeights::kBf16) {
  const ModelConfig& c = model.config();
  auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 4}, 256);
  EXPECT_TRUE(cache.ok());
  auto backend = make_cpu_backend(model, **cache, 2, weights);
  EXPECT_TRUE(backend.ok()) << backend.status();
  ModelRunner runner(model, **cache, *std::move(backend));
  const cache::SeqId seq = *runner.start({.policy = cache::Policy::kFpa, .tau = 4.0f});
  std::vector<int32_t> tokens = {256, 7, 99, 3, 42, 42, 5};
  std::vector<float> all, logits(c.vocab_size);
  for (int i = 0; i <= steps; ++i) {
    EXPECT_TRUE(
        runner.step(std::vector<cache::BatchItem>{{seq, tokens, runner.position(seq)}}, logits)
            .ok());
    all.insert(all.end(), logits.begin(), logits.end());
    tokens = {
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
  }
  return all;
}

// A BF16 file's projections kept as stored (no float32 copy, LoadOptions::keep_bf16) decode
// exactly as the same file widened at load and rounded back: the same bits reach the kernels.
// The float32 path and the CUDA backend refuse such a model rather than read null weights.
TEST(KeptBf16Weights, DecodeExactlyAsTheWidenedModel) {
  if (!cpu::cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  testing::TempDir dir;
  testing::write_model(dir.path(), bf16_projections(testing::random_model("fpa", "free", 3)));
  auto kept = Model::load(dir.path(), {.keep_bf16 = true});
  auto widened = Model::load(dir.path());
  ASSERT_TRUE(kept.ok() && widened.ok());
  const LayerWeights& w = (*kept)->layers()[1];
  EXPECT_EQ(w.w_down.data, nullptr);
  ASSERT_NE(w.w_down.bf16, nullptr);
  EXPECT_EQ(bf16_to_float(w.w_down.bf16[5]), (*widened)->layers()[1].w_down.data[5]);
  EXPECT_NE(w.field_w.data, nullptr);  // the field's projections stay float32
  EXPECT_TRUE(keeps_bf16(**kept));
  EXPECT_FALSE(keeps_bf16(**widened));
  EXPECT_EQ(generate(**kept, 12), generate(**widened, 12));
  const ModelConfig& c = (*kept)->config();
  auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 4}, 64);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(make_cpu_backend(**kept, **cache, 2, CpuWeights::kF32).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// An I8 file's projections kept as stored (LoadOptions::keep_int8) decode as the same file
// widened at load and quantized again by the backend: the same integers reach the kernels, the
// scales recomputed from the widened rows within a rounding of the stored ones. The float32 and
// bf16 paths refuse such a model rather than read null weights.
TEST(KeptInt8Weights, DecodeAsTheWidenedModel) {
  if (!cpu::cpu_has_vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  testing::TempDir dir;
  testing::write_model(dir.path(), int8_projections(testing::random_model("fpa", "free", 3)));
  auto kept = Model::load(dir.path(), {.keep_bf16 = true, .keep_int8 = true});
  auto widened = Model::load(dir.path());
  ASSERT_TRUE(kept.ok() && widened.ok());
  EXPECT_EQ((*kept)->layers()[1].w_down.data, nullptr);
  const std::vector<float> a = generate(**kept, 12, CpuWeights::kInt8);
  const std::vector<float> b = generate(**widened, 12, CpuWeights::kInt8);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << i;
  const ModelConfig& c = (*kept)->config();
  auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 4}, 64);
  ASSERT_TRUE(cache.ok());
  for (CpuWeights other : {CpuWeights::kF32, CpuWeights::kBf16}) {
    EXPECT_EQ(make_cpu_backend(**kept, **cache, 2, other).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace fpa
