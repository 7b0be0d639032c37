// Golden vectors from the published Forgetting Transformer code (tests/vectors/hf/, made by
// train/make_hf_vectors.py running the FoX repository's model classes, only the CUDA kernels
// replaced by plain PyTorch of the same formulas): the saved Hugging Face directories (FoX LLaMA,
// the Transformer baseline, FoX Pro and its options one by one) load, and
// the CPU backend's logits match within 1e-4 through one-shot and chunked prefill and token-by-
// token decode, with eviction off and, for FoX, at a tau where keys are evicted (then equal to the
// published forward with those keys masked).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>

#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/engine/parity_util.h"

namespace fpa {
namespace {

constexpr double kTolerance = 1e-4;  // max |ours - reference| / max |reference|

std::string case_dir(const std::string& name) {
  return std::string(FPA_VECTORS_DIR) + "/hf/" + name;
}

class HfGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto file = SafetensorsFile::open(case_dir(GetParam()) + "/case.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    case_ = *std::move(file);
    auto model = Model::load(case_dir(GetParam()));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    const std::string tau = case_->metadata().at("tau");
    tau_ = tau == "none" ? 0.0f : std::stof(tau);
    const TensorView tok = *case_->get("tokens");
    tokens_.resize(tok.numel());
    std::memcpy(tokens_.data(), tok.bytes.data(), tok.bytes.size());
    const ModelConfig& c = model_->config();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16, 4}, 4096);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto backend = make_cpu_backend(*model_, *cache_, 2);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  std::vector<float> f32(const std::string& name) { return to_float32(*case_->get(name)); }
  int T() const { return static_cast<int>(tokens_.size()); }
  int V() const { return model_->config().vocab_size; }

  // Every position's logits, the tokens fed `chunk` at a time to a fresh sequence.
  std::vector<float> run(cache::Policy policy, int chunk, int64_t* live_keys = nullptr) {
    auto seq = cache_->add_sequence({.policy = policy, .tau = tau_});
    EXPECT_TRUE(seq.ok()) << seq.status();
    std::vector<float> logits(static_cast<size_t>(T()) * V());
    for (int at = 0; at < T(); at += chunk) {
      const int n = std::min(chunk, T() - at);
      const cache::BatchItem item{*seq, std::span(tokens_).subspan(at, n), at};
      ForwardTrace trace{.all_logits = true};
      const absl::Status s =
          backend_->forward({&item, 1}, std::span(logits).subspan(at * V()), &trace);
      EXPECT_TRUE(s.ok()) << s;
    }
    if (live_keys != nullptr) *live_keys = cache_->sequence_stats(*seq).live_keys;
    return logits;
  }

  std::unique_ptr<SafetensorsFile> case_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<Backend> backend_;
  std::vector<int32_t> tokens_;
  float tau_ = 0.0f;
};

TEST_P(HfGolden, FullCacheLogitsThroughPrefillChunksAndDecode) {
  const std::vector<float> ref = f32("logits");
  for (int chunk : {T(), 7, 1}) {
    const double err = rel_error(run(cache::Policy::kNone, chunk), ref);
    EXPECT_LE(err, kTolerance) << "chunk " << chunk;
    std::cout << GetParam() << " chunk " << chunk << ": relative error " << err << "\n";
  }
}

TEST_P(HfGolden, FoxEvictionEqualsThePublishedForwardWithThoseKeysMasked) {
  if (tau_ == 0.0f) GTEST_SKIP() << "no forget gate: nothing to evict";
  const std::vector<float> ref = f32("evict_logits");
  EXPECT_GT(rel_error(f32("logits"), ref), 1e-3) << "the case should evict keys that matter";
  const ModelConfig& c = model_->config();
  const int64_t full = int64_t{c.n_layers} * c.n_heads * T();
  for (int chunk : {7, 1}) {
    int64_t live = 0;
    const double err = rel_error(run(cache::Policy::kFpa, chunk, &live), ref);
    EXPECT_LE(err, kTolerance) << "chunk " << chunk;
    EXPECT_LT(live, full) << "chunk " << chunk;
    std::cout << GetParam() << " chunk " << chunk << ": " << live << " of " << full
              << " keys live at tau " << tau_ << ", relative error " << err << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(PublishedCode, HfGolden,
                         ::testing::Values("fox_llama", "fox_tied", "transformer", "fox_pro",
                                           "fox_pro_noshift", "fox_qknorm_shared",
                                           "fox_ogate_silu"));

// FoX Pro's shift needs the previous token's projections: a fork (a prefix-cache snapshot or hit)
// takes its source's (before, it had none and its next step was refused), so both go on alike.
TEST_P(HfGolden, AForkGoesOnFromItsSourcesShiftRows) {
  if (!model_->config().k_shift) GTEST_SKIP() << "no key/value shift";
  auto parent = cache_->add_sequence({.policy = cache::Policy::kNone});
  ASSERT_TRUE(parent.ok());
  std::vector<float> logits(static_cast<size_t>(5) * V()), from_parent(V()), from_child(V());
  const cache::BatchItem prompt{*parent, std::span(tokens_).subspan(0, 5), 0};
  ASSERT_TRUE(backend_->forward({&prompt, 1}, logits, nullptr).ok());
  auto child = cache_->fork(*parent);
  ASSERT_TRUE(child.ok()) << child.status();
  for (auto [seq, out] : {std::pair{*parent, &from_parent}, std::pair{*child, &from_child}}) {
    const cache::BatchItem next{seq, std::span(tokens_).subspan(5, 1), 5};
    ASSERT_TRUE(backend_->forward({&next, 1}, *out, nullptr).ok());
  }
  EXPECT_EQ(from_child, from_parent);
}

}  // namespace
}  // namespace fpa
