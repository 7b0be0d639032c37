// CUDA backend parity (issue 5): against the PyTorch reference vectors (tests/vectors/) and the CPU
// backend, full cache and with eviction, one-shot, chunked and step by step, solo and batched.
// Every test skips, saying why, when no CUDA device is present; tests/gpu/run.sh fails on any skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/step_plan.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/engine/parity_util.h"
#include "tests/gpu/vectors_dir.h"

namespace fpa {
namespace {

// max |ours - reference| / max |reference|: float32 on both sides, or bf16 weights and keys.
constexpr double kF32Tolerance = 2e-4;
constexpr double kBf16Tolerance = 4e-2;
// |margin| below the band: rounding may decide the key either way. bf16 moves phi further (the
// first layer's field is exact, later layers see bf16 attention outputs).
constexpr float kF32TieBand = 1e-3f;
constexpr float kBf16TieBand = 0.5f;
// The vectors' tau is small (2.5 to 3.5) so that they evict: a key decided the other way near
// its threshold still carries up to exp(-tau) of a key's weight, beyond bf16 rounding.
constexpr double kBf16EvictTolerance = 1e-1;

// Says which vectors the run reads: the device bundle's, or the source tree's (bundle_check.sh
// and run.sh's logs rely on this line).
class VectorsEnvironment : public ::testing::Environment {
  void SetUp() override { std::printf("vectors: %s\n", vectors_dir().c_str()); }
};
const ::testing::Environment* const kVectorsEnvironment =
    ::testing::AddGlobalTestEnvironment(new VectorsEnvironment);

class CudaParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine";
    const std::string dir = vectors_dir() + "/" + GetParam();
    // The vectors are part of the repository (and of the device bundle): missing is a failure.
    if (!std::filesystem::exists(dir + "/case.safetensors")) FAIL() << "no vectors in " << dir;
    auto file = SafetensorsFile::open(dir + "/case.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    case_ = *std::move(file);
    const auto& meta = case_->metadata();
    const std::string model_dir =
        std::filesystem::exists(dir + "/config.json") ? dir : repo_path(meta.at("model_dir"));
    auto model = Model::load(model_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    tau_ = std::stof(meta.at("tau"));
    const TensorView tok = *case_->get("tokens");
    tokens_.resize(tok.numel());
    std::memcpy(tokens_.data(), tok.bytes.data(), tok.bytes.size());
    live_ = case_->get("live")->bytes;
    margin_ = f32("margin");
  }

  // A fresh device cache and CUDA backend (float32 unless `bf16`) of `pages` pages; `splits` > 0
  // forces the attention's split count; `settle_after_step` and `graphs` as in CudaOptions.
  void make_cuda(bool bf16, int64_t pages = 4096, int splits = 0, bool settle_after_step = true,
                 bool graphs = true) {
    const ModelConfig& c = model_->config();
    const CudaOptions options{.half_precision = bf16,
                              .attention_splits = splits,
                              .settle_after_step = settle_after_step,
                              .graphs = graphs};
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16, kv_bytes(options)},
                                        pages, false);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    cuda_.reset();
    auto backend = create_cuda_backend(*model_, *cache_, options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    cuda_ = *std::move(backend);
  }

  std::vector<float> f32(const std::string& name) { return to_float32(*case_->get(name)); }
  int T() const { return static_cast<int>(tokens_.size()); }
  int V() const { return model_->config().vocab_size; }
  const ModelConfig& cfg() const { return model_->config(); }

  cache::SeqId start(cache::KvCache& cache, cache::Policy policy) {
    auto seq = cache.add_sequence({.policy = policy, .tau = tau_});
    EXPECT_TRUE(seq.ok()) << seq.status();
    return *seq;
  }

  // Every position's logits, feeding the tokens in chunks.
  std::vector<float> run_chunks(Backend& backend, cache::SeqId seq, int chunk,
                                std::vector<std::vector<float>>* layers = nullptr) {
    std::vector<float> logits(static_cast<size_t>(T()) * V());
    for (int at = 0; at < T(); at += chunk) {
      const int n = std::min(chunk, T() - at);
      const cache::BatchItem item{seq, std::span(tokens_).subspan(at, n), at};
      ForwardTrace trace{.all_logits = true, .layer_outputs = layers};
      const absl::Status s =
          backend.forward({&item, 1}, std::span(logits).subspan(at * V()), &trace);
      EXPECT_TRUE(s.ok()) << s;
    }
    return logits;
  }

  // The reference's live set of a stream after step i, and the keys within the tie band there.
  bool ref_live(int i, int l, int h, int j) const {
    return live_[((static_cast<size_t>(i) * cfg().n_layers + l) * cfg().n_heads + h) * T() + j] !=
           std::byte{0};
  }
  float margin(int i, int l, int h, int j) const {
    return margin_[((static_cast<size_t>(i) * cfg().n_layers + l) * cfg().n_heads + h) * T() + j];
  }

  // Compares the device's live sets after step i with the reference, outside keys whose margin
  // was ever within `band` (`tied` accumulates them). Returns the device's live keys.
  int64_t check_live(cache::SeqId seq, int i, float band, std::vector<uint8_t>& tied) {
    int64_t total = 0;
    for (int l = 0; l < cfg().n_layers; ++l) {
      for (int h = 0; h < cfg().n_heads; ++h) {
        auto ours = cuda_->live_positions(seq, l, h);
        EXPECT_TRUE(ours.ok()) << ours.status();
        EXPECT_EQ(*ours, live_positions(*cache_, seq, l, h)) << "device mirror vs host bookkeeping";
        const std::set<int32_t> live(ours->begin(), ours->end());
        total += static_cast<int64_t>(live.size());
        for (int j = 0; j <= i; ++j) {
          uint8_t& t = tied[(static_cast<size_t>(l) * cfg().n_heads + h) * T() + j];
          t |= std::fabs(margin(i, l, h, j)) < band;
          if (!t) {
            EXPECT_EQ(live.contains(j), ref_live(i, l, h, j))
                << "step " << i << " layer " << l << " head " << h << " key " << j;
          }
        }
      }
    }
    return total;
  }

  std::vector<uint8_t> no_ties() const {
    return std::vector<uint8_t>(static_cast<size_t>(cfg().n_layers) * cfg().n_heads * T());
  }

  // Keys whose margin was within `band` at any step: a run that evicts between chunks, or in
  // another order, may have decided them either way.
  std::vector<uint8_t> ties_of_any_step(float band) const {
    std::vector<uint8_t> tied = no_ties();
    for (int i = 0; i < T(); ++i) {
      for (int l = 0; l < cfg().n_layers; ++l)
        for (int h = 0; h < cfg().n_heads; ++h)
          for (int j = 0; j <= i; ++j)
            tied[(static_cast<size_t>(l) * cfg().n_heads + h) * T() + j] |=
                std::fabs(margin(i, l, h, j)) < band;
    }
    return tied;
  }

  // Decodes token by token with fpa eviction, checking logits and live sets at every step.
  void decode_with_eviction(double tolerance, float band) {
    const cache::SeqId seq = start(*cache_, cache::Policy::kFpa);
    const std::vector<float> ref = f32("evict_logits");
    std::vector<uint8_t> tied = no_ties();
    std::vector<float> logits(V());
    for (int i = 0; i < T(); ++i) {
      const cache::BatchItem item{seq, std::span(tokens_).subspan(i, 1), i};
      ASSERT_TRUE(cuda_->forward({&item, 1}, logits).ok());
      EXPECT_LE(rel_error(logits, std::span(ref).subspan(i * V(), V())), tolerance) << "step " << i;
      const int64_t live = check_live(seq, i, band, tied);
      EXPECT_EQ(live, cache_->sequence_stats(seq).live_keys) << "device and host disagree";
    }
    cache_->release(seq);
  }

  // The CPU backend beside the device, on its own cache, to compare with step by step.
  void make_cpu() {
    const ModelConfig& c = cfg();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16}, 4096);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cpu_cache_ = *std::move(cache);
    auto backend = make_cpu_backend(*model_, *cpu_cache_, 2);
    ASSERT_TRUE(backend.ok()) << backend.status();
    cpu_ = *std::move(backend);
  }

  std::unique_ptr<SafetensorsFile> case_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<CudaBackend> cuda_;
  std::unique_ptr<cache::KvCache> cpu_cache_;
  std::unique_ptr<Backend> cpu_;
  std::vector<int32_t> tokens_;
  std::span<const std::byte> live_;
  std::vector<float> margin_;
  float tau_ = 0.0f;
};

TEST_P(CudaParityTest, FullCacheLogitsAndLayerOutputs) {
  for (bool bf16 : {false, true}) {
    make_cuda(bf16);
    std::vector<std::vector<float>> layers;
    const std::vector<float> logits =
        run_chunks(*cuda_, start(*cache_, cache::Policy::kNone), T(), &layers);
    const double tol = bf16 ? kBf16Tolerance : kF32Tolerance;
    EXPECT_LE(rel_error(logits, f32("logits")), tol) << "bf16 " << bf16;
    ASSERT_EQ(layers.size(), static_cast<size_t>(cfg().n_layers));
    for (size_t l = 0; l < layers.size(); ++l) {
      EXPECT_LE(rel_error(layers[l], f32("layer_out." + std::to_string(l))), tol)
          << "layer " << l << " bf16 " << bf16;
    }
  }
}

TEST_P(CudaParityTest, ChunkedPrefillEqualsOneShot) {
  make_cuda(false);
  const std::vector<float> one_shot = run_chunks(*cuda_, start(*cache_, cache::Policy::kNone), T());
  for (int chunk : {7, 1, 40}) {
    const std::vector<float> chunked =
        run_chunks(*cuda_, start(*cache_, cache::Policy::kNone), chunk);
    EXPECT_LE(rel_error(chunked, one_shot), 1e-5) << "chunk " << chunk;
  }
}

TEST_P(CudaParityTest, DecodeWithEvictionMatchesLiveSetsStepByStep) {
  make_cuda(false);
  decode_with_eviction(kF32Tolerance, kF32TieBand);
}

TEST_P(CudaParityTest, Bf16DecodeWithEviction) {
  make_cuda(true);
  decode_with_eviction(kBf16EvictTolerance, kBf16TieBand);
}

TEST_P(CudaParityTest, ChunkedPrefillWithEvictionMatchesDecode) {
  make_cuda(false);
  for (int chunk : {7, 16}) {
    const cache::SeqId seq = start(*cache_, cache::Policy::kFpa);
    const std::vector<float> logits = run_chunks(*cuda_, seq, chunk);
    EXPECT_LE(rel_error(logits, f32("evict_logits")), kF32Tolerance) << "chunk " << chunk;
    std::vector<uint8_t> tied = ties_of_any_step(kF32TieBand);
    EXPECT_EQ(check_live(seq, T() - 1, kF32TieBand, tied), cache_->sequence_stats(seq).live_keys);
  }
}

// A small pool, filled and released over and over: reused pages must come back clean, and
// compaction must carry the keys it moves.
TEST_P(CudaParityTest, ReusedPagesStayExact) {
  make_cuda(false,
            /*pages=*/static_cast<int64_t>(cfg().n_layers) * cfg().n_heads * ((T() + 15) / 16 + 1));
  for (int round = 0; round < 3; ++round) decode_with_eviction(kF32Tolerance, kF32TieBand);
}

// The CPU backend on the same inputs, side by side: logits and live sets (device live counts
// against the CPU cache's) at every decode step.
TEST_P(CudaParityTest, MatchesTheCpuBackend) {
  make_cuda(false);
  make_cpu();
  const cache::SeqId gs = start(*cache_, cache::Policy::kFpa);
  const cache::SeqId cs = start(*cpu_cache_, cache::Policy::kFpa);
  std::vector<float> gl(V()), cl(V());
  for (int i = 0; i < T(); ++i) {
    const cache::BatchItem g{gs, std::span(tokens_).subspan(i, 1), i};
    const cache::BatchItem h{cs, std::span(tokens_).subspan(i, 1), i};
    ASSERT_TRUE(cuda_->forward({&g, 1}, gl).ok());
    ASSERT_TRUE(cpu_->forward({&h, 1}, cl).ok());
    EXPECT_LE(rel_error(gl, cl), kF32Tolerance) << "step " << i;
    EXPECT_EQ(cache_->sequence_stats(gs).live_keys, cpu_cache_->sequence_stats(cs).live_keys)
        << "step " << i;
  }
}

// A fork on the device (the prefix cache's snapshot and hit: cache::DevicePool, which the backend
// attaches itself as) holds its source's keys there, and decoding on gives the source's logits
// and live sets (up to the order the copy packed its keys in).
TEST_P(CudaParityTest, AForkGoesOnAsItsSource) {
  make_cuda(false);
  const cache::SeqId a = start(*cache_, cache::Policy::kFpa);
  std::vector<float> la(V()), lb(V());
  const int half = T() / 2;
  for (int i = 0; i < half; ++i) {
    const cache::BatchItem item{a, std::span(tokens_).subspan(i, 1), i};
    ASSERT_TRUE(cuda_->forward({&item, 1}, la).ok());
  }
  const absl::StatusOr<cache::SeqId> b = cache_->fork(a);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int i = half; i < T(); ++i) {
    const cache::BatchItem ia{a, std::span(tokens_).subspan(i, 1), i};
    const cache::BatchItem ib{*b, std::span(tokens_).subspan(i, 1), i};
    ASSERT_TRUE(cuda_->forward({&ia, 1}, la).ok());
    ASSERT_TRUE(cuda_->forward({&ib, 1}, lb).ok());
    EXPECT_LE(rel_error(lb, la), kF32Tolerance) << "step " << i;
    for (int l = 0; l < cfg().n_layers; ++l) {
      for (int h = 0; h < cfg().n_heads; ++h) {
        EXPECT_EQ(*cuda_->live_positions(*b, l, h), *cuda_->live_positions(a, l, h))
            << "step " << i << " layer " << l << " head " << h;
      }
    }
  }
}

// Three sequences in one batch (a prompt in chunks beside two decoding ones) give what each gives
// alone.
TEST_P(CudaParityTest, BatchedEqualsSolo) {
  make_cuda(false);
  const std::vector<float> solo = run_chunks(*cuda_, start(*cache_, cache::Policy::kFpa), 1);
  const cache::SeqId a = start(*cache_, cache::Policy::kFpa);
  const cache::SeqId b = start(*cache_, cache::Policy::kFpa);
  const cache::SeqId p = start(*cache_, cache::Policy::kFpa);
  const int chunk = 5;
  std::vector<float> out(3 * static_cast<size_t>(V()));
  for (int i = 0; i < T(); ++i) {
    std::vector<cache::BatchItem> items{{a, std::span(tokens_).subspan(i, 1), i},
                                        {b, std::span(tokens_).subspan(i, 1), i}};
    if (i * chunk < T()) {
      const int n = std::min(chunk, T() - i * chunk);
      items.push_back({p, std::span(tokens_).subspan(i * chunk, n), i * chunk});
    }
    ASSERT_TRUE(cuda_->forward(items, out).ok());
    for (int k = 0; k < 2; ++k) {
      EXPECT_LE(
          rel_error(std::span(out).subspan(k * V(), V()), std::span(solo).subspan(i * V(), V())),
          kF32Tolerance)
          << "step " << i << " item " << k;
    }
  }
}

// A decode step run as one graph, launch by launch, and settled layer by layer (a prompt in
// chunks first, which always settles per layer): the same logits and the same live keys, since
// settling after the step changes nothing the device reads (decode_step.h).
TEST_P(CudaParityTest, DecodePathsAgree) {
  struct Path {
    bool settle_after_step, graphs;
  };
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<std::vector<int32_t>>> live;
  for (Path path : {Path{true, true}, Path{true, false}, Path{false, false}}) {
    make_cuda(false, 4096, 0, path.settle_after_step, path.graphs);
    const cache::SeqId seq = start(*cache_, cache::Policy::kFpa);
    const int prompt = T() / 2;
    std::vector<float> out(static_cast<size_t>(T()) * V());
    for (int at = 0; at < T(); at += at < prompt ? 7 : 1) {
      const int n = at < prompt ? std::min(7, prompt - at) : 1;
      const cache::BatchItem item{seq, std::span(tokens_).subspan(at, n), at};
      ASSERT_TRUE(cuda_->forward({&item, 1}, std::span(out).subspan((at + n - 1) * V())).ok());
    }
    logits.push_back(std::vector<float>(out.begin() + prompt * V(), out.end()));
    live.emplace_back();
    for (int l = 0; l < cfg().n_layers; ++l) {
      for (int h = 0; h < cfg().n_heads; ++h) {
        auto ours = cuda_->live_positions(seq, l, h);
        ASSERT_TRUE(ours.ok()) << ours.status();
        EXPECT_EQ(*ours, live_positions(*cache_, seq, l, h)) << "device mirror vs host bookkeeping";
        live.back().push_back(*ours);
      }
    }
  }
  for (size_t p = 1; p < logits.size(); ++p) {
    EXPECT_LE(rel_error(logits[p], logits[0]), 1e-6) << "path " << p;
    EXPECT_EQ(live[p], live[0]) << "path " << p;
  }
}

// The split path (partial softmax states per part of the cached pages, then the combine) on every
// case, whatever its length: decode and chunked prefill with eviction against the reference.
// 64 parts leave most of them empty on these short sequences.
TEST_P(CudaParityTest, ForcedSplitsMatchTheReference) {
  for (int splits : {1, 3, 64}) {
    make_cuda(false, 4096, splits);
    decode_with_eviction(kF32Tolerance, kF32TieBand);
    const std::vector<float> logits = run_chunks(*cuda_, start(*cache_, cache::Policy::kFpa), 7);
    EXPECT_LE(rel_error(logits, f32("evict_logits")), kF32Tolerance) << "splits " << splits;
  }
}

// Chunked prefill over an existing cache inside mixed batches (kMixedPlans), against the CPU
// backend on the same batches: every row's logits against the CPU backend's and the reference's,
// and after every batch each stream's device live set against the device's host bookkeeping and
// the CPU backend's cache.
TEST_P(CudaParityTest, MixedBatchesMatchTheCpuBackend) {
  make_cuda(false);
  make_cpu();
  const ModelConfig& c = cfg();
  std::vector<cache::SeqId> gpu_seqs, cpu_seqs;
  for (size_t k = 0; k < std::size(kMixedPlans); ++k) {
    gpu_seqs.push_back(start(*cache_, cache::Policy::kFpa));
    cpu_seqs.push_back(start(*cpu_cache_, cache::Policy::kFpa));
  }
  std::vector<int> done(gpu_seqs.size(), 0);
  const std::vector<float> ref = f32("evict_logits");
  const std::vector<uint8_t> tied = ties_of_any_step(kF32TieBand);
  const std::vector<std::vector<Piece>> batches = mixed_batches(T());
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<cache::BatchItem> on_gpu, on_cpu;
    size_t rows = 0;
    for (const Piece& p : batches[b]) {
      on_gpu.push_back({gpu_seqs[p.seq], std::span(tokens_).subspan(p.at, p.n), p.at});
      on_cpu.push_back({cpu_seqs[p.seq], std::span(tokens_).subspan(p.at, p.n), p.at});
      rows += p.n;
      done[p.seq] = p.at + p.n;
    }
    std::vector<float> gl(rows * V()), cl(rows * V());
    ForwardTrace trace{.all_logits = true};
    ASSERT_TRUE(cuda_->forward(on_gpu, gl, &trace).ok()) << "batch " << b;
    ASSERT_TRUE(cpu_->forward(on_cpu, cl, &trace).ok()) << "batch " << b;
    EXPECT_LE(rel_error(gl, cl), kF32Tolerance) << "batch " << b;
    size_t row = 0;
    for (const Piece& p : batches[b]) {
      const size_t n = static_cast<size_t>(p.n) * V();
      EXPECT_LE(
          rel_error(std::span(gl).subspan(row * V(), n), std::span(ref).subspan(p.at * V(), n)),
          kF32Tolerance)
          << "batch " << b << " sequence " << p.seq << " at " << p.at;
      row += p.n;
    }
    for (size_t k = 0; k < gpu_seqs.size(); ++k) {
      for (int l = 0; l < c.n_layers; ++l) {
        for (int h = 0; h < c.n_heads; ++h) {
          auto ours = cuda_->live_positions(gpu_seqs[k], l, h);
          ASSERT_TRUE(ours.ok()) << ours.status();
          EXPECT_EQ(*ours, live_positions(*cache_, gpu_seqs[k], l, h)) << "device mirror vs host";
          const std::vector<int32_t> theirs = live_positions(*cpu_cache_, cpu_seqs[k], l, h);
          for (int j = 0; j < done[k]; ++j) {
            if (tied[(static_cast<size_t>(l) * c.n_heads + h) * T() + j]) continue;
            EXPECT_EQ(std::binary_search(ours->begin(), ours->end(), j),
                      std::binary_search(theirs.begin(), theirs.end(), j))
                << "batch " << b << " sequence " << k << " layer " << l << " head " << h << " key "
                << j;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vectors, CudaParityTest,
                         ::testing::Values("fpa_free", "fpa_tied", "fox", "softmax", "shipped",
                                           "long"));

// Host only: the long case makes the backend split a stream's cached keys (attention_splits > 1,
// the combine kernel) when it decodes one token, even with eviction (the fewest pages its live
// keys can fill, at the step with the most).
TEST(CudaParityVectors, LongCaseSplitsTheCachedKeys) {
  auto file = SafetensorsFile::open(vectors_dir() + "/long/case.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorView live = *(*file)->get("live");  // [T, layers, heads, T]
  ASSERT_EQ(live.shape.size(), 4u);
  const int64_t steps = live.shape[0], streams = live.shape[1] * live.shape[2];
  const int heads = static_cast<int>(live.shape[2]), slots = 16;
  int64_t most_live = 0;
  for (int64_t s = 0; s < steps * streams; ++s) {
    int64_t n = 0;
    for (int64_t j = 0; j < live.shape[3]; ++j)
      n += live.bytes[s * live.shape[3] + j] != std::byte{0};
    most_live = std::max(most_live, n);
  }
  const int fewest_pages = static_cast<int>((most_live + slots - 1) / slots);
  EXPECT_GE(steps, 300);
  EXPECT_GE(cuda::attention_splits(heads, static_cast<int>(steps)), 3) << "full cache";
  EXPECT_GE(cuda::attention_splits(heads, fewest_pages * slots), 3)
      << "with eviction: at most " << most_live << " live keys";
}

// Runs (and skips nothing) either way, so that tests/gpu/run.sh can count any skip as a failure.
TEST(CudaBackend, StartsWithADeviceAndIsUnavailableWithout) {
  auto model = Model::load(vectors_dir() + "/fpa_tied");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto cache = cache::KvCache::create(
      {c.n_layers, c.n_heads, c.head_dim, 16, kv_bytes(CudaOptions{})}, 64, false);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto backend = make_cuda_backend(**model, **cache);
  if (cuda_device_available()) {
    EXPECT_TRUE(backend.ok()) << backend.status();
  } else {
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  }
}

TEST(CudaBackend, RefusesAHostStorageCache) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine";
  auto model = Model::load(vectors_dir() + "/fpa_tied");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16}, 64, true);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto backend = make_cuda_backend(**model, **cache);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << backend.status();
}

}  // namespace
}  // namespace fpa
