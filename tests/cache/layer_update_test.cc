// The layer update shared out on threads (apply_layer with Workers) leaves every stream exactly as
// the serial update does: the same live keys with the same levels, minima, masses and contents,
// the same counts, for every policy, over prompt chunks and decode steps in one batch. Built once
// more under ThreadSanitizer (cache_tests_tsan): the threads edit different sequences through the
// one pool and its ledger.
#include "cache/layer_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/cache/cache_test_util.h"

namespace fpa::cache {
namespace {

constexpr CacheShape kShape{.n_layers = 2, .n_heads = 3, .head_dim = 4, .page_slots = 4};

// f(0) on the calling thread, the rest on threads of their own.
Workers thread_workers(int threads) {
  return {threads, [](int n, const std::function<void(int)>& f) {
            std::vector<std::thread> others;
            for (int i = 1; i < n; ++i) others.emplace_back(f, i);
            f(0);
            for (std::thread& t : others) t.join();
          }};
}

PolicyConfig policy_of(int i) {
  PolicyConfig p;
  const Policy policies[] = {Policy::kFpa,  Policy::kWindow, Policy::kH2O, Policy::kFpa,
                             Policy::kTova, Policy::kSinks,  Policy::kNone};
  p.policy = policies[i % 7];
  p.tau = 2.0f;
  p.budget_fraction = 0.4f;
  p.min_budget = 6;
  return p;
}

// One step's rows for `tokens` rows: a random walk's phi, levels around it, random keys, values
// and masses.
struct StepRows {
  std::vector<float> phi, lvl, acc, kv;
  LayerRows view() const {
    return {phi.data(), lvl.data(), acc.data(), kShape.n_heads,
            1,          kv.data(),  kv.data(),  kShape.n_heads * kShape.head_dim};
  }
};

StepRows random_rows(int tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  StepRows r;
  const auto n = static_cast<size_t>(tokens * kShape.n_heads);
  for (size_t i = 0; i < n; ++i) {
    r.phi.push_back(normal(rng));
    r.lvl.push_back(normal(rng));
    r.acc.push_back(std::abs(normal(rng)));
  }
  for (size_t i = 0; i < n * kShape.head_dim; ++i) r.kv.push_back(normal(rng));
  return r;
}

// (layer, head) -> the stream's live keys as (position, k[0], v[0], level, minimum, mass): what
// two caches whose page ids differ must agree on.
using Key = std::tuple<int32_t, float, float, float, float, float>;
std::map<std::pair<int, int>, std::vector<Key>> contents(KvCache& cache, SeqId seq) {
  std::map<std::pair<int, int>, std::vector<Key>> out;
  for (int l = 0; l < kShape.n_layers; ++l) {
    for (int h = 0; h < kShape.n_heads; ++h) {
      for (const auto& [pos, key] : testing::live_keys(cache, seq, l, h)) {
        out[{l, h}].emplace_back(pos, key.k0, key.v0, key.lvl, key.m, key.acc);
      }
    }
  }
  return out;
}

TEST(LayerUpdate, SharedOutOnThreadsEqualsSerial) {
  auto serial = testing::make_cache(kShape, 4096);
  auto shared = testing::make_cache(kShape, 4096);
  constexpr int kSequences = 9;
  std::vector<SeqId> a, b;
  for (int i = 0; i < kSequences; ++i) {
    a.push_back(*serial->add_sequence(policy_of(i)));
    b.push_back(*shared->add_sequence(policy_of(i)));
  }
  const std::vector<float> beta{1.0f, 0.5f, 2.0f};
  std::mt19937 rng(7);
  std::vector<int32_t> length(kSequences, 0);
  for (int step = 0; step < 60; ++step) {
    // Every third step some sequences bring a prompt chunk; the rest decode one token.
    std::vector<std::vector<int32_t>> ids(kSequences);
    std::vector<BatchItem> items_a, items_b;
    int rows = 0;
    for (int i = 0; i < kSequences; ++i) {
      const int n = step % 3 == 0 && (i + step) % 4 == 0 ? 1 + static_cast<int>(rng() % 12) : 1;
      ids[i].assign(static_cast<size_t>(n), 1);
      items_a.push_back({a[i], ids[i], length[i]});
      items_b.push_back({b[i], ids[i], length[i]});
      length[i] += n;
      rows += n;
    }
    const StepRows r = random_rows(rows, rng);
    for (int l = 0; l < kShape.n_layers; ++l) {
      const absl::StatusOr<int64_t> one = apply_layer(*serial, l, items_a, beta, r.view());
      const Workers workers = thread_workers(2 + step % 3);
      const absl::StatusOr<int64_t> many =
          apply_layer(*shared, l, items_b, beta, r.view(), &workers);
      ASSERT_TRUE(one.ok() && many.ok()) << one.status() << many.status();
      EXPECT_EQ(*one, *many) << "step " << step << " layer " << l;
    }
  }
  std::map<SeqId, int64_t> full_a, full_b;
  for (int i = 0; i < kSequences; ++i) {
    EXPECT_EQ(contents(*serial, a[i]), contents(*shared, b[i])) << "sequence " << i;
    full_a[a[i]] = full_b[b[i]] = int64_t{length[i]} * kShape.n_layers * kShape.n_heads;
  }
  testing::expect_consistent(*serial, full_a);
  testing::expect_consistent(*shared, full_b);
  const CacheStats sa = serial->stats(), sb = shared->stats();
  EXPECT_GT(sa.evicted_slots, 0);
  EXPECT_EQ(sa.evicted_slots, sb.evicted_slots);
  EXPECT_EQ(sa.live_slots, sb.live_slots);
  EXPECT_EQ(sa.pages_in_use, sb.pages_in_use);
}

}  // namespace
}  // namespace fpa::cache
