// ns per decode-step cache operation (one eviction call + one insert, one stream) in a steady
// state of W live keys, for each policy; and the cost of a stats() read.
//   build-x/tests/cache/cache_ops_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/stream_access.h"

namespace fpa::cache {
namespace {

constexpr CacheShape kShape{.n_layers = 1, .n_heads = 1, .head_dim = 64, .page_slots = 16};

std::unique_ptr<KvCache> make(int64_t live) {
  auto cache = KvCache::create(kShape, live / kShape.page_slots + 4);
  if (!cache.ok()) std::abort();
  return *std::move(cache);
}

// fpa with lvl_j = -j, phi_i = -i, tau / beta = W: exactly the key W steps back dies each step,
// so the heap holds W keys and every step pops one and pushes one.
void BM_FpaStep(benchmark::State& state) {
  const int64_t w = state.range(0);
  auto cache = make(w);
  PolicyConfig p;
  p.tau = static_cast<float>(w);
  const SeqId seq = *cache->add_sequence(p);
  const std::vector<float> kv(kShape.head_dim, 1.0f);
  int32_t pos = 0;
  int64_t evicted = 0;
  for (auto _ : state) {
    const float phi = -static_cast<float>(pos);
    evicted += StreamAccess(*cache).evict_for_step(seq, 0, 0, phi, 1.0f, pos);
    benchmark::DoNotOptimize(
        StreamAccess(*cache).insert(seq, 0, 0, pos, phi, kv.data(), kv.data()));
    ++pos;
  }
  state.counters["live"] = static_cast<double>(cache->stats().live_slots);
  state.counters["evicted/step"] = static_cast<double>(evicted) / static_cast<double>(pos);
}

// A heuristic policy held at a fixed budget of W keys (min_budget W, a negligible fraction).
void BM_BudgetStep(benchmark::State& state, Policy policy) {
  const int64_t w = state.range(0);
  auto cache = make(w);
  PolicyConfig p;
  p.policy = policy;
  p.budget_fraction = 1e-9f;
  p.min_budget = static_cast<int>(w);
  const SeqId seq = *cache->add_sequence(p);
  const std::vector<float> kv(kShape.head_dim, 1.0f);
  int32_t pos = 0;
  for (auto _ : state) {
    StreamAccess(*cache).evict_for_step(seq, 0, 0, 0.0f, 1.0f, pos);
    const auto ref = StreamAccess(*cache).insert(seq, 0, 0, pos, 0.0f, kv.data(), kv.data());
    // What the kernel would add to the new key's attention mass (h2o ranks by it).
    cache->page(ref->page).acc[ref->slot] += static_cast<float>(pos % 7);
    ++pos;
  }
  state.counters["live"] = static_cast<double>(cache->stats().live_slots);
}

void BM_StatsRead(benchmark::State& state) {
  auto cache = make(1024);
  for (auto _ : state) benchmark::DoNotOptimize(cache->stats());
}

BENCHMARK(BM_FpaStep)->Arg(64)->Arg(1024)->Arg(16384);
BENCHMARK_CAPTURE(BM_BudgetStep, window, Policy::kWindow)->Arg(64)->Arg(1024)->Arg(16384);
BENCHMARK_CAPTURE(BM_BudgetStep, sinks, Policy::kSinks)->Arg(64)->Arg(1024)->Arg(16384);
BENCHMARK_CAPTURE(BM_BudgetStep, h2o, Policy::kH2O)->Arg(64)->Arg(1024)->Arg(16384);
BENCHMARK(BM_StatsRead);

}  // namespace
}  // namespace fpa::cache

BENCHMARK_MAIN();
