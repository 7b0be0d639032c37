// FoX Pro on the CUDA backend (issue 25): the published code's golden vectors (tests/vectors/hf:
// FoX Pro, its options one by one, FoX LLaMA, tied embeddings, the Transformer baseline) and the
// CPU backend side by side, through one-shot and chunked prefill, decode steps on every decode
// path (one graph, launch by launch, settled per layer), mixed batches and a preempted sequence
// recomputed from the start, with eviction off and at the case's tau. Every test skips, saying
// why, when no CUDA device is present; tests/gpu/run.sh fails on any skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/engine/parity_util.h"
#include "tests/gpu/vectors_dir.h"

namespace fpa {
namespace {

// max |ours - reference| / max |reference|, float32: the bound, the CPU backend's too.
constexpr double kF32Tolerance = 1e-4;
// bf16 weights and keys against the float32 reference (the other CUDA suites' bounds): a key
// decided the other way near its threshold still carries up to exp(-tau) of a key's weight.
constexpr double kBf16Tolerance = 4e-2;
constexpr double kBf16EvictTolerance = 1e-1;

struct Path {
  bool settle_after_step, graphs;
};
constexpr Path kDecodePaths[] = {{true, true}, {true, false}, {false, false}};

class FoxProParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine";
    const std::string dir = vectors_dir() + "/hf/" + GetParam();
    auto file = SafetensorsFile::open(dir + "/case.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    case_ = *std::move(file);
    auto model = Model::load(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    const std::string tau = case_->metadata().at("tau");
    tau_ = tau == "none" ? 0.0f : std::stof(tau);
    const TensorView tok = *case_->get("tokens");
    tokens_.resize(tok.numel());
    std::memcpy(tokens_.data(), tok.bytes.data(), tok.bytes.size());
    make_cpu();
  }

  const ModelConfig& cfg() const { return model_->config(); }
  int T() const { return static_cast<int>(tokens_.size()); }
  int V() const { return cfg().vocab_size; }
  std::vector<float> f32(const std::string& name) { return to_float32(*case_->get(name)); }
  // The reference of a policy: the published forward, with the keys fox eviction drops masked.
  std::vector<float> ref(cache::Policy policy) {
    return f32(policy == cache::Policy::kNone ? "logits" : "evict_logits");
  }

  void make_cuda(bool bf16 = false, Path path = kDecodePaths[0]) {
    const CudaOptions options{
        .half_precision = bf16, .settle_after_step = path.settle_after_step, .graphs = path.graphs};
    const ModelConfig& c = cfg();
    cuda_.reset();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16, kv_bytes(options)},
                                        1024, false);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto backend = create_cuda_backend(*model_, *cache_, options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    cuda_ = *std::move(backend);
  }

  void make_cpu() {
    const ModelConfig& c = cfg();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16}, 1024);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cpu_cache_ = *std::move(cache);
    auto backend = make_cpu_backend(*model_, *cpu_cache_, 2);
    ASSERT_TRUE(backend.ok()) << backend.status();
    cpu_ = *std::move(backend);
  }

  cache::SeqId start(cache::KvCache& cache, cache::Policy policy) {
    auto seq = cache.add_sequence({.policy = policy, .tau = tau_});
    EXPECT_TRUE(seq.ok()) << seq.status();
    return *seq;
  }

  // Every position's logits, the tokens fed `chunk` at a time to `seq` (traced: every step
  // settles layer by layer).
  std::vector<float> run_chunks(Backend& backend, cache::SeqId seq, int chunk) {
    std::vector<float> logits(static_cast<size_t>(T()) * V());
    for (int at = 0; at < T(); at += chunk) {
      const int n = std::min(chunk, T() - at);
      const cache::BatchItem item{seq, std::span(tokens_).subspan(at, n), at};
      ForwardTrace trace{.all_logits = true};
      const absl::Status s =
          backend.forward({&item, 1}, std::span(logits).subspan(at * V()), &trace);
      EXPECT_TRUE(s.ok()) << s;
    }
    return logits;
  }

  // A prompt in chunks of 7 up to T / 2, then decode steps without a trace (the path's own decode
  // step); the logits of the decoded positions.
  std::vector<float> prompt_then_decode(Backend& backend, cache::SeqId seq) {
    const int prompt = T() / 2;
    std::vector<float> out(static_cast<size_t>(T()) * V());
    for (int at = 0; at < T(); at += at < prompt ? 7 : 1) {
      const int n = at < prompt ? std::min(7, prompt - at) : 1;
      const cache::BatchItem item{seq, std::span(tokens_).subspan(at, n), at};
      const absl::Status s =
          backend.forward({&item, 1}, std::span(out).subspan((at + n - 1) * V()));
      EXPECT_TRUE(s.ok()) << "at " << at << ": " << s;
    }
    return std::vector<float>(out.begin() + static_cast<size_t>(prompt) * V(), out.end());
  }

  std::span<const float> rows(const std::vector<float>& all, int from) const {
    return std::span(all).subspan(static_cast<size_t>(from) * V());
  }

  std::unique_ptr<SafetensorsFile> case_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<cache::KvCache> cache_, cpu_cache_;
  std::unique_ptr<CudaBackend> cuda_;
  std::unique_ptr<Backend> cpu_;
  std::vector<int32_t> tokens_;
  float tau_ = 0.0f;
};

// The policies a case is run under: eviction off, and fox eviction at the case's tau where the
// model has a forget gate.
std::vector<cache::Policy> policies(float tau) {
  if (tau == 0.0f) return {cache::Policy::kNone};
  return {cache::Policy::kNone, cache::Policy::kFpa};
}

TEST_P(FoxProParity, PrefillChunksMatchThePublishedCodeAndTheCpu) {
  make_cuda();
  for (cache::Policy policy : policies(tau_)) {
    const std::vector<float> expected = ref(policy);
    for (int chunk : {T(), 7, 1}) {
      const std::vector<float> ours = run_chunks(*cuda_, start(*cache_, policy), chunk);
      const std::vector<float> cpu = run_chunks(*cpu_, start(*cpu_cache_, policy), chunk);
      EXPECT_LE(rel_error(ours, expected), kF32Tolerance)
          << "chunk " << chunk << " policy " << static_cast<int>(policy);
      EXPECT_LE(rel_error(ours, cpu), kF32Tolerance)
          << "chunk " << chunk << " policy " << static_cast<int>(policy);
    }
  }
}

// Decode steps carry the shift rows on each path: the graph, launch by launch, per layer.
TEST_P(FoxProParity, DecodeStepsOnEveryPathMatchTheReferenceAndTheCpu) {
  for (cache::Policy policy : policies(tau_)) {
    const std::vector<float> expected = ref(policy);
    const cache::SeqId cs = start(*cpu_cache_, policy);
    const std::vector<float> cpu = prompt_then_decode(*cpu_, cs);
    for (const Path& path : kDecodePaths) {
      make_cuda(false, path);
      const cache::SeqId gs = start(*cache_, policy);
      const std::vector<float> ours = prompt_then_decode(*cuda_, gs);
      const std::string where = "policy " + std::to_string(static_cast<int>(policy)) +
                                " settle_after_step " + std::to_string(path.settle_after_step) +
                                " graphs " + std::to_string(path.graphs);
      EXPECT_LE(rel_error(ours, rows(expected, T() / 2)), kF32Tolerance) << where;
      EXPECT_LE(rel_error(ours, cpu), kF32Tolerance) << where;
      EXPECT_EQ(cache_->sequence_stats(gs).live_keys, cpu_cache_->sequence_stats(cs).live_keys)
          << where;
    }
  }
}

// The cases with a forget gate.
class FoxEviction : public FoxProParity {};

// Fox eviction keeps fewer keys than the full cache and the same ones as the CPU backend.
TEST_P(FoxEviction, KeepsTheCpuBackendsKeys) {
  make_cuda();
  const int64_t full = int64_t{cfg().n_layers} * cfg().n_heads * T();
  for (int chunk : {7, 1}) {
    const cache::SeqId gs = start(*cache_, cache::Policy::kFpa);
    const cache::SeqId cs = start(*cpu_cache_, cache::Policy::kFpa);
    run_chunks(*cuda_, gs, chunk);
    run_chunks(*cpu_, cs, chunk);
    const int64_t live = cache_->sequence_stats(gs).live_keys;
    EXPECT_LT(live, full) << "chunk " << chunk << ": the case should evict";
    EXPECT_EQ(live, cpu_cache_->sequence_stats(cs).live_keys) << "chunk " << chunk;
    for (int l = 0; l < cfg().n_layers; ++l) {
      for (int h = 0; h < cfg().n_heads; ++h) {
        auto ours = cuda_->live_positions(gs, l, h);
        ASSERT_TRUE(ours.ok()) << ours.status();
        EXPECT_EQ(*ours, live_positions(*cpu_cache_, cs, l, h))
            << "chunk " << chunk << " layer " << l << " head " << h;
      }
    }
  }
}

// Sequences side by side (a prompt in chunks beside decoding ones, kMixedPlans), and a decoding
// one preempted halfway and recomputed from position 0 as a new sequence in later batches (the
// released sequence's shift slot goes to it, zeroed): every row's logits against the reference.
TEST_P(FoxProParity, MixedBatchesAndARecomputedSequence) {
  constexpr int kPreempted = 2;
  make_cuda();
  const cache::Policy policy = policies(tau_).back();
  const std::vector<float> expected = ref(policy);
  std::vector<cache::SeqId> seqs;
  for (size_t k = 0; k < std::size(kMixedPlans); ++k) seqs.push_back(start(*cache_, policy));
  const std::vector<std::vector<Piece>> batches = mixed_batches(T());
  const size_t preempt_at = batches.size() / 2;
  cache::SeqId redo = -1;
  int redo_at = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    if (b == preempt_at) {  // the engine's preemption: released, then recomputed from the start
      cache_->release(seqs[kPreempted]);
      redo = start(*cache_, policy);
    }
    std::vector<cache::BatchItem> items;
    std::vector<int> at;
    for (const Piece& p : batches[b]) {
      if (b >= preempt_at && p.seq == kPreempted) continue;
      items.push_back({seqs[p.seq], std::span(tokens_).subspan(p.at, p.n), p.at});
      at.push_back(p.at);
    }
    if (redo >= 0 && redo_at < T()) {
      const int n = std::min(9, T() - redo_at);
      items.push_back({redo, std::span(tokens_).subspan(redo_at, n), redo_at});
      at.push_back(redo_at);
      redo_at += n;
    }
    if (items.empty()) continue;  // the batches left only the preempted sequence's pieces
    size_t n_rows = 0;
    for (const cache::BatchItem& it : items) n_rows += it.tokens.size();
    std::vector<float> out(n_rows * V());
    ForwardTrace trace{.all_logits = true};
    ASSERT_TRUE(cuda_->forward(items, out, &trace).ok()) << "batch " << b;
    size_t row = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t n = items[i].tokens.size() * V();
      EXPECT_LE(rel_error(std::span(out).subspan(row * V(), n), rows(expected, at[i]).first(n)),
                kF32Tolerance)
          << "batch " << b << " item " << i << " at " << at[i];
      row += items[i].tokens.size();
    }
  }
  EXPECT_EQ(redo_at, T()) << "the recomputed sequence should have caught up";
}

TEST_P(FoxProParity, Bf16StaysNearTheReference) {
  make_cuda(/*bf16=*/true);
  for (cache::Policy policy : policies(tau_)) {
    const std::vector<float> ours = run_chunks(*cuda_, start(*cache_, policy), 7);
    EXPECT_LE(rel_error(ours, ref(policy)),
              policy == cache::Policy::kNone ? kBf16Tolerance : kBf16EvictTolerance)
        << "policy " << static_cast<int>(policy);
  }
}

INSTANTIATE_TEST_SUITE_P(PublishedCode, FoxProParity,
                         ::testing::Values("fox_pro", "fox_pro_noshift", "fox_qknorm_shared",
                                           "fox_ogate_silu", "fox_llama", "fox_tied",
                                           "transformer"));
INSTANTIATE_TEST_SUITE_P(PublishedCode, FoxEviction,
                         ::testing::Values("fox_pro", "fox_pro_noshift", "fox_qknorm_shared",
                                           "fox_ogate_silu", "fox_llama", "fox_tied"));

// A fork (the prefix cache's hit, a parallel sample) has its source's keys on the device but
// not its shift rows: refused, never computed wrong (the CPU backend's forks carry their rows,
// KvCache::on_fork; TODO(issue 25) the CUDA shift slots too).
TEST(FoxProShift, AForkWithoutShiftRowsIsRefused) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine";
  auto model = Model::load(vectors_dir() + "/hf/fox_pro");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto cache = cache::KvCache::create(
      {c.n_layers, c.n_heads, c.head_dim, 16, kv_bytes(CudaOptions{})}, 256, false);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto backend = make_cuda_backend(**model, **cache);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto parent = (*cache)->add_sequence({.policy = cache::Policy::kNone});
  ASSERT_TRUE(parent.ok());
  const std::vector<int32_t> tokens{5, 6, 7, 8, 9, 10};
  std::vector<float> logits(c.vocab_size);
  const cache::BatchItem prompt{*parent, std::span(tokens).first(5), 0};
  ASSERT_TRUE((*backend)->forward({&prompt, 1}, logits).ok());
  auto child = (*cache)->fork(*parent);
  ASSERT_TRUE(child.ok()) << child.status();
  const cache::BatchItem next{*child, std::span(tokens).subspan(5, 1), 5};
  const absl::Status s = (*backend)->forward({&next, 1}, logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  const cache::BatchItem parent_next{*parent, std::span(tokens).subspan(5, 1), 5};
  EXPECT_TRUE((*backend)->forward({&parent_next, 1}, logits).ok()) << "the source goes on";
}

}  // namespace
}  // namespace fpa
