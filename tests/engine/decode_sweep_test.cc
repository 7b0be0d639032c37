// The decode sweep (kernels/cpu/decode_sweep.h) against decode_attention stream by stream: the
// same outputs, own-key masses, m and acc, over streams whose pages lie in runs strewn over the
// pool, on one thread and on two.
#include "kernels/cpu/decode_sweep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "cache/page_table.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

constexpr int kPages = 96, kSlots = 16;

// A pool of pages behind the kernels' read view; only what the sweep reads is implemented.
class Pool : public cache::KvView {
 public:
  Pool(int dim, int kv_bytes)
      : shape_{1, 1, dim, kSlots, kv_bytes},
        table_(std::move(cache::PageTable::create(shape_, kPages, true)).value()) {}

  const cache::CacheShape& shape() const override { return shape_; }
  bool contains(cache::SeqId) const override { return false; }
  int64_t length(cache::SeqId) const override { return 0; }
  float threshold(cache::SeqId, float) const override { return 0.0f; }
  cache::MassRule mass_rule(cache::SeqId) const override { return {}; }
  float last_phi(cache::SeqId, int, int) const override { return 0.0f; }
  std::span<const int32_t> pages(cache::SeqId, int, int) const override { return {}; }
  cache::PageView page(int32_t id) override { return table_->view(id); }
  int64_t page_stride() const override { return table_->stride(); }

  // Every slot from the seed: random k, v and levels, m in [-1, 1), a fifth of the slots free.
  void fill(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const int dim = shape_.head_dim;
    for (int p = 0; p < kPages; ++p) {
      const cache::PageView v = table_->view(p);
      for (int j = 0; j < kSlots; ++j) {
        for (int d = 0; d < dim; ++d) {
          const float k = normal(rng), x = normal(rng);
          if (v.k16 != nullptr) {
            v.k16[j * dim + d] = fpa::round_to_bf16(k), v.v16[j * dim + d] = fpa::round_to_bf16(x);
          } else {
            v.k[j * dim + d] = k, v.v[j * dim + d] = x;
          }
        }
        v.lvl[j] = normal(rng), v.m[j] = unit(rng), v.acc[j] = 0.25f;
        v.pos[j] = unit(rng) < -0.6f ? -1 : p * kSlots + j;
      }
    }
  }

 private:
  cache::CacheShape shape_;
  std::unique_ptr<cache::PageTable> table_;
};

// Streams' page lists: runs of 1-5 consecutive pages, the pool's pages dealt out in a shuffled
// order of runs, so a stream's runs lie apart and out of order; the last stream holds no page.
std::vector<std::vector<int32_t>> deal(int streams, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::pair<int32_t, int>> runs;
  for (int32_t p = 0; p < kPages;) {
    const int n = std::min<int>(1 + rng() % 5, kPages - p);
    runs.push_back({p, n});
    p += n;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  std::vector<std::vector<int32_t>> out(streams);
  for (size_t r = 0; r < runs.size(); ++r) {
    for (int i = 0; i < runs[r].second; ++i) out[r % (streams - 1)].push_back(runs[r].first + i);
  }
  return out;
}

class DecodeSweepTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(DecodeSweepTest, EqualsDecodeAttentionStreamByStream) {
  const auto [dim, kv_bytes, threads] = GetParam();
  const int n = 9;
  Pool swept(dim, kv_bytes), each(dim, kv_bytes);
  swept.fill(5), each.fill(5);
  const std::vector<std::vector<int32_t>> pages = deal(n, 6);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(n * dim), own(2 * n * dim);
  for (float& x : q) x = normal(rng);
  for (float& x : own) x = normal(rng);
  std::vector<float> out(n * dim), want(n * dim), mass(n, -1.0f), want_mass(n);
  std::vector<DecodeStream> streams;
  for (int s = 0; s < n; ++s) {
    // Every mass rule, some keys excluded (threshold 1.5) and some not (softmax's beta 0).
    const auto mode = static_cast<cache::MassRule::Mode>(s % 3);
    const Penalty pen{s % 4 == 0 ? 0.0f : 0.8f, s % 2 == 0 ? 1.5f : INFINITY};
    const float* k = &own[2 * s * dim];
    streams.push_back({pages[s],
                       &q[s * dim],
                       {k, k + dim},
                       0.1f * s - 0.4f,
                       pen,
                       {mode, 0, 1},
                       &out[s * dim],
                       &mass[s]});
    std::vector<cache::PageView> views;
    for (int32_t id : pages[s]) views.push_back(each.page(id));
    want_mass[s] = decode_attention(&q[s * dim], streams[s].phi, streams[s].own, pen, dim,
                                    {views, kSlots, streams[s].mass}, &want[s * dim]);
  }
  ThreadPool pool(threads);
  DecodeSweep().run(&pool, swept, dim, streams);
  for (int i = 0; i < n * dim; ++i) {
    EXPECT_NEAR(out[i], want[i], 1e-6f * (1.0f + std::abs(want[i]))) << i;
  }
  for (int s = 0; s < n; ++s) EXPECT_NEAR(mass[s], want_mass[s], 1e-6f) << s;
  for (int p = 0; p < kPages; ++p) {
    for (int j = 0; j < kSlots; ++j) {
      EXPECT_EQ(swept.page(p).m[j], each.page(p).m[j]) << p << " " << j;
      EXPECT_NEAR(swept.page(p).acc[j], each.page(p).acc[j], 1e-6f) << p << " " << j;
    }
  }
}

// head_dim 8 takes the generic kernel, 64 the vectorised one; float32 and bf16 pages; one thread
// and two (on two, some streams' runs lie in both threads' ranges).
INSTANTIATE_TEST_SUITE_P(Shapes, DecodeSweepTest,
                         ::testing::Combine(::testing::Values(8, 64), ::testing::Values(4, 2),
                                            ::testing::Values(1, 2)));

}  // namespace
}  // namespace fpa::cpu
