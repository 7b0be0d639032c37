// Parity with the PyTorch reference (tests/vectors/, written by train/make_vectors.py): logits
// and residual streams of every attention kind, chunked prefill, and decode with eviction down to
// the live-key set of every step, layer and head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>

#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cpu/bf16_linear.h"
#include "kernels/cpu/int8_linear.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/engine/parity_util.h"

namespace fpa {
namespace {

constexpr double kTolerance = 1e-4;  // max |ours - reference| / max |reference|
constexpr float kTieBand = 1e-3f;    // |margin| below this: rounding may decide either way

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = std::string(FPA_VECTORS_DIR) + "/" + GetParam();
    if (GetParam() == "shipped" && !std::filesystem::exists(dir + "/case.safetensors")) {
      GTEST_SKIP() << "no shipped-model vectors yet (models/fpa-v2 not trained)";
    }
    auto file = SafetensorsFile::open(dir + "/case.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    case_ = *std::move(file);
    const auto& meta = case_->metadata();
    const std::string model_dir = std::filesystem::exists(dir + "/config.json")
                                      ? dir
                                      : std::string(FPA_REPO_ROOT) + "/" + meta.at("model_dir");
    auto model = Model::load(model_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    tau_ = std::stof(meta.at("tau"));
    margin_ = f32("margin");
    const TensorView tok = *case_->get("tokens");
    tokens_.resize(tok.numel());
    std::memcpy(tokens_.data(), tok.bytes.data(), tok.bytes.size());
    make_cpu(4);
  }

  // A fresh cache whose keys and values take `kv_bytes` (4: float32, 2: bf16), and the CPU
  // backend on it.
  void make_cpu(int kv_bytes) {
    const ModelConfig& c = model_->config();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16, kv_bytes}, 4096);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto backend = make_cpu_backend(*model_, *cache_, 2);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  std::vector<float> f32(const std::string& name) { return to_float32(*case_->get(name)); }
  int T() const { return static_cast<int>(tokens_.size()); }
  int V() const { return model_->config().vocab_size; }

  cache::SeqId start(cache::Policy policy) {
    auto seq = cache_->add_sequence({.policy = policy, .tau = tau_});
    EXPECT_TRUE(seq.ok()) << seq.status();
    return *seq;
  }

  // Runs the tokens through in chunks; returns every position's logits.
  std::vector<float> run_chunks(cache::SeqId seq, int chunk,
                                std::vector<std::vector<float>>* layers = nullptr) {
    std::vector<float> logits(static_cast<size_t>(T()) * V());
    for (int at = 0; at < T(); at += chunk) {
      const int n = std::min(chunk, T() - at);
      const cache::BatchItem item{seq, std::span(tokens_).subspan(at, n), at};
      ForwardTrace trace{.all_logits = true, .layer_outputs = layers};
      const absl::Status s =
          backend_->forward({&item, 1}, std::span(logits).subspan(at * V()), &trace);
      EXPECT_TRUE(s.ok()) << s;
    }
    return logits;
  }

  long index(int i, int l, int h, int j) const {
    const ModelConfig& c = model_->config();
    return ((static_cast<long>(i) * c.n_layers + l) * c.n_heads + h) * T() + j;
  }

  // Marks the keys whose margin at step i lies within the tie band (tied is [layer, head, key]).
  void mark_ties(int i, std::vector<uint8_t>& tied) const {
    const ModelConfig& c = model_->config();
    tied.resize(static_cast<size_t>(c.n_layers) * c.n_heads * T());
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_heads; ++h)
        for (int j = 0; j <= i; ++j)
          tied[index(0, l, h, j)] |= std::fabs(margin_[index(i, l, h, j)]) < kTieBand;
  }

  // Compares the cache's live sets with the reference's after step i, except for tied keys.
  // Returns how many keys the reference has evicted by then.
  int check_live_sets(cache::SeqId seq, int i, const std::vector<uint8_t>& tied) {
    const ModelConfig& c = model_->config();
    const TensorView live_ref = *case_->get("live");
    int evicted = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_heads; ++h) {
        const std::vector<int32_t> pos = live_positions(*cache_, seq, l, h);
        const std::set<int32_t> ours(pos.begin(), pos.end());
        for (int j = 0; j <= i; ++j) {
          const bool ref = live_ref.bytes[index(i, l, h, j)] != std::byte{0};
          evicted += !ref;
          if (!tied[index(0, l, h, j)]) {
            EXPECT_EQ(ours.contains(j), ref)
                << "step " << i << " layer " << l << " head " << h << " key " << j;
          }
        }
      }
    }
    return evicted;
  }

  std::unique_ptr<SafetensorsFile> case_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<Backend> backend_;
  std::vector<int32_t> tokens_;
  std::vector<float> margin_;  // [step, layer, head, key]
  float tau_ = 0.0f;
};

TEST_P(ParityTest, FullCacheLogitsAndLayerOutputs) {
  std::vector<std::vector<float>> layers;
  const std::vector<float> logits = run_chunks(start(cache::Policy::kNone), T(), &layers);
  EXPECT_LE(rel_error(logits, f32("logits")), kTolerance);
  ASSERT_EQ(layers.size(), static_cast<size_t>(model_->config().n_layers));
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_LE(rel_error(layers[l], f32("layer_out." + std::to_string(l))), kTolerance) << l;
  }
}

TEST_P(ParityTest, ChunkedPrefillEqualsOneShot) {
  const std::vector<float> one_shot = run_chunks(start(cache::Policy::kNone), T());
  for (int chunk : {7, 1}) {
    const std::vector<float> chunked = run_chunks(start(cache::Policy::kNone), chunk);
    EXPECT_LE(rel_error(chunked, one_shot), 1e-5) << "chunk " << chunk;
    EXPECT_LE(rel_error(chunked, f32("logits")), kTolerance) << "chunk " << chunk;
  }
}

TEST_P(ParityTest, DecodeWithEvictionMatchesLiveSetsStepByStep) {
  const cache::SeqId seq = start(cache::Policy::kFpa);
  const std::vector<float> ref = f32("evict_logits");
  std::vector<uint8_t> tied;
  std::vector<float> logits(V());
  int evicted = 0;
  for (int i = 0; i < T(); ++i) {
    const cache::BatchItem item{seq, std::span(tokens_).subspan(i, 1), i};
    ASSERT_TRUE(backend_->forward({&item, 1}, logits).ok());
    EXPECT_LE(rel_error(logits, std::span(ref).subspan(i * V(), V())), kTolerance) << "step " << i;
    mark_ties(i, tied);
    evicted = check_live_sets(seq, i, tied);
  }
  if (model_->config().attention != AttentionKind::kSoftmax) {
    EXPECT_GT(evicted, 0) << "the case should evict";
  }
  std::cout << GetParam() << ": " << evicted << " keys evicted, "
            << std::count(tied.begin(), tied.end(), 1) << " within the tie band\n";
}

TEST_P(ParityTest, ChunkedPrefillWithEvictionMatchesDecode) {
  const cache::SeqId seq = start(cache::Policy::kFpa);
  const std::vector<float> logits = run_chunks(seq, 7);
  EXPECT_LE(rel_error(logits, f32("evict_logits")), kTolerance);
  std::vector<uint8_t> tied;
  for (int i = 0; i < T(); ++i) mark_ties(i, tied);
  check_live_sets(seq, T() - 1, tied);
}

// Prompt chunks over an existing cache in the same batches as decode tokens (kMixedPlans): every
// row's logits, and each sequence's live sets after every batch, against the reference.
TEST_P(ParityTest, MixedBatchesMatchTheReference) {
  std::vector<cache::SeqId> seqs;
  for (size_t k = 0; k < std::size(kMixedPlans); ++k) seqs.push_back(start(cache::Policy::kFpa));
  const std::vector<float> ref = f32("evict_logits");
  std::vector<uint8_t> tied;
  for (int i = 0; i < T(); ++i) mark_ties(i, tied);
  const std::vector<std::vector<Piece>> batches = mixed_batches(T());
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<cache::BatchItem> items;
    size_t rows = 0;
    for (const Piece& p : batches[b]) {
      items.push_back({seqs[p.seq], std::span(tokens_).subspan(p.at, p.n), p.at});
      rows += p.n;
    }
    std::vector<float> logits(rows * V());
    ForwardTrace trace{.all_logits = true};
    ASSERT_TRUE(backend_->forward(items, logits, &trace).ok()) << "batch " << b;
    size_t row = 0;
    for (const Piece& p : batches[b]) {
      const size_t n = static_cast<size_t>(p.n) * V();
      EXPECT_LE(
          rel_error(std::span(logits).subspan(row * V(), n), std::span(ref).subspan(p.at * V(), n)),
          kTolerance)
          << "batch " << b << " sequence " << p.seq << " at " << p.at;
      row += p.n;
      check_live_sets(seqs[p.seq], p.at + p.n - 1, tied);
    }
  }
}

// bf16 weights (the field's projections stay float32): each weight and activation moves by up
// to 2^-9 of itself; through the layers the vectors' logits move by 0.3-0.6% (measured), held
// here to 2e-2, half the CUDA backend's bf16 tolerance. With eviction a key near its threshold
// may be decided the other way, and such a key still carries up to exp(-tau) of a key's
// weight: 5e-2.
TEST_P(ParityTest, Bf16WeightsStayWithinTolerance) {
  if (!cpu::cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  auto bf16 = make_cpu_backend(*model_, *cache_, 2, CpuWeights::kBf16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  backend_ = *std::move(bf16);
  const double full = rel_error(run_chunks(start(cache::Policy::kNone), T()), f32("logits"));
  const double evict = rel_error(run_chunks(start(cache::Policy::kFpa), 7), f32("evict_logits"));
  EXPECT_LE(full, 2e-2);
  EXPECT_LE(evict, 5e-2);
  EXPECT_GT(full, 0.0) << "bf16 rounding should show";
  std::cout << GetParam() << ": bf16 weights, relative error " << full << " (full cache), " << evict
            << " (fpa eviction)\n";
}

// int8 weights (per-row weight scales, per-token activation scales; the field's projections
// stay float32): each factor moves by up to half a step of its row's (token's) largest
// magnitude / 127, more than bf16's 2^-9 of itself on the small values. Through the layers the
// vectors' logits move by 1.2-2.8% (measured), held here to 5e-2. With eviction a key near its
// threshold may be decided the other way, and the shipped model's vectors then move by 11%
// (measured; the other models' by 1-2%): 0.15. Whether that costs the model accuracy is
// measured on its own (bench/RESULTS.md, issue 26), not assumed from these figures.
TEST_P(ParityTest, Int8WeightsStayWithinTolerance) {
  if (!cpu::cpu_has_vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  auto int8 = make_cpu_backend(*model_, *cache_, 2, CpuWeights::kInt8);
  ASSERT_TRUE(int8.ok()) << int8.status();
  backend_ = *std::move(int8);
  const double full = rel_error(run_chunks(start(cache::Policy::kNone), T()), f32("logits"));
  const double evict = rel_error(run_chunks(start(cache::Policy::kFpa), 7), f32("evict_logits"));
  EXPECT_LE(full, 5e-2);
  EXPECT_LE(evict, 0.15);
  EXPECT_GT(full, 0.0) << "int8 rounding should show";
  std::cout << GetParam() << ": int8 weights, relative error " << full << " (full cache), " << evict
            << " (fpa eviction)\n";
}

// bf16 KV cache pages (lvl and m stay float32, so eviction decisions move only through the
// rounded keys' effect on later layers): the same bounds as bf16 weights, for the same reason
// (2^-8 relative rounding of what the products read), and the decode path (one token at a time
// over the cached keys) as well as the chunked one.
TEST_P(ParityTest, Bf16KvCacheStaysWithinTolerance) {
  make_cpu(2);
  ASSERT_FALSE(HasFatalFailure());
  const double full = rel_error(run_chunks(start(cache::Policy::kNone), 5), f32("logits"));
  const double evict = rel_error(run_chunks(start(cache::Policy::kFpa), 1), f32("evict_logits"));
  EXPECT_LE(full, 2e-2);
  EXPECT_LE(evict, 5e-2);
  EXPECT_GT(full, 0.0) << "bf16 rounding should show";
  std::cout << GetParam() << ": bf16 KV cache, relative error " << full << " (full cache), "
            << evict << " (fpa eviction, decode)\n";
}

INSTANTIATE_TEST_SUITE_P(Vectors, ParityTest,
                         ::testing::Values("fpa_free", "fpa_tied", "fox", "softmax", "shipped",
                                           "long"));

}  // namespace
}  // namespace fpa
