// The decode step without a per-layer host round-trip (decode_step.h), on the host: every
// layer's attention runs on the pre-step pool, the cache settles all layers after the step, and
// the emulated device pool (pool_mirror.h) must end each step exactly where the per-layer order
// (attend, update, next layer) leaves it, equal to a brute-force FPA reference, with the retired
// counts the kernels report agreeing with the cache's evictions. The emulated pool is the cache's
// device: it learns the step's edits only through cache::DevicePool, as the backend does.
#include "kernels/cuda/decode_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "cache/kv_cache.h"
#include "kernels/cuda/flat_edits.h"
#include "tests/gpu/pool_mirror.h"

namespace fpa::cuda {
namespace {

constexpr int kLayers = 3;
constexpr int kHeads = 2;
constexpr int kSlots = 4;
// Tight enough that layers outgrow their regions of the pool (cache/page_ledger.h): only then does
// a page change layer within a step, the case the deferred update order is tested on (90 runs out).
constexpr int kPages = 100;
const ModelDims kDims{259, kLayers, kHeads, 4};
const std::vector<int32_t> kToken{65};  // every step's token (the tests feed their own field)

// One stream's field: a random walk with free levels that falls often, so keys die steadily.
struct Walk {
  std::vector<float> phi, lvl;
  Walk(int n, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-1.0f, 0.5f), u(-1.0f, 1.0f);
    float p = 0.0f;
    for (int t = 0; t < n; ++t) {
      phi.push_back(p += d(rng));
      lvl.push_back(p + u(rng));
    }
  }
};

struct Stream {
  Walk walk;
  std::map<int32_t, float> live;  // the reference: pos -> lvl
};

struct Seq {
  cache::SeqId id = -1;
  int32_t pos = 0;
  std::vector<Stream> streams;  // [layer][head]
  Stream& at(int l, int h) { return streams[static_cast<size_t>(l * kHeads + h)]; }
};

class DecodeStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cache = cache::KvCache::create({kLayers, kHeads, 4, kSlots}, kPages, false);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    cache_->attach_device(&deferred_);
    for (int l = 0; l < kLayers; ++l) {
      betas_.push_back({1.0f + 0.5f * static_cast<float>(l), 0.5f});
      views_.emplace_back(betas_.back());
    }
  }

  void add_seq(int n, std::mt19937& rng) {
    Seq& s = seqs_.emplace_back();
    auto id = cache_->add_sequence({.policy = cache::Policy::kFpa, .tau = 2.0f});
    ASSERT_TRUE(id.ok()) << id.status();
    s.id = *id;
    for (int i = 0; i < kLayers * kHeads; ++i) s.streams.push_back({Walk(n, rng), {}});
  }

  // A new sequence's first decode token, reserved in the cache: the step's settle comes next.
  std::vector<cache::BatchItem> reserve_first_token(uint32_t seed) {
    std::mt19937 rng(seed);
    add_seq(8, rng);
    std::vector<cache::BatchItem> items{{seqs_.back().id, kToken, 0}};
    EXPECT_TRUE(cache_->reserve(items[0].seq, 1));
    return items;
  }

  // The field rows of the step, [layer][row][head], as the device's field kernel writes them.
  void field(std::vector<float>& phi, std::vector<float>& lvl) {
    for (int l = 0; l < kLayers; ++l) {
      for (Seq& s : seqs_) {
        for (int h = 0; h < kHeads; ++h) {
          phi.push_back(s.at(l, h).walk.phi[s.pos]);
          lvl.push_back(s.at(l, h).walk.lvl[s.pos]);
        }
      }
    }
  }

  // One decode step of every sequence, run the deferred way and checked against the per-layer
  // order and the reference. Returns pages one layer's update took that another layer held when
  // the step began (the reuse that makes the update order matter).
  int step() {
    std::vector<cache::BatchItem> items;
    for (Seq& s : seqs_) items.push_back({s.id, kToken, s.pos});
    auto layout = plan_batch(items, items.size() * 259, false, kDims);
    EXPECT_TRUE(layout.ok()) << layout.status();
    for (const cache::BatchItem& item : items) EXPECT_TRUE(cache_->reserve(item.seq, 1));
    const KernelInputs in = kernel_inputs(items, views_, *cache_);
    std::vector<float> phi, lvl;
    field(phi, lvl);

    PoolMirror per_layer = deferred_;  // the same pool, updated layer by layer below
    std::vector<int32_t> retired(kLayers, 0);
    for (int l = 0; l < kLayers; ++l) retired[l] = attend(deferred_, in, l, phi);
    deferred_.forget_received();
    const absl::Status settled =
        settle_decode(*cache_, items, *layout, views_, {phi.data(), lvl.data()}, retired);
    EXPECT_TRUE(settled.ok()) << settled;
    const auto& sent = deferred_.received().layers;  // what the cache sent, layer by layer
    EXPECT_EQ(sent.size(), size_t{kLayers});
    if (!settled.ok() || sent.size() != size_t{kLayers}) return 0;
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(sent[l].first, l);
      attend(per_layer, in, l, phi);
      per_layer.apply(l, sent[l].second);
    }
    for (const cache::BatchItem& item : items) cache_->unreserve(item.seq);
    check(per_layer);
    return reused_across_layers(in, sent);
  }

  int attend(PoolMirror& pool, const KernelInputs& in, int l, const std::vector<float>& phi) {
    int retired = 0;
    const size_t n = seqs_.size();
    for (size_t i = 0; i < n; ++i) {
      for (int h = 0; h < kHeads; ++h) {
        const size_t st = (l * n + i) * kHeads + h;
        retired +=
            pool.attend(std::span(in.tables.ids).subspan(in.tables.offset[st], in.tables.count[st]),
                        seqs_[i].pos, phi[st], in.thr[st]);
      }
    }
    return retired;
  }

  void check(const PoolMirror& per_layer) {
    for (Seq& s : seqs_) {
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kHeads; ++h) {
          Stream& st = s.at(l, h);
          const float thr = 2.0f / betas_[l][h];
          const float p = st.walk.phi[s.pos];
          std::erase_if(st.live, [&](const auto& kv) { return kv.second - p >= thr; });
          st.live[s.pos] = st.walk.lvl[s.pos];
          std::set<int32_t> want;
          for (const auto& kv : st.live) want.insert(kv.first);
          const std::span<const int32_t> pages = cache_->pages(s.id, l, h);
          EXPECT_EQ(deferred_.live(pages), want) << "layer " << l << " head " << h;
          EXPECT_EQ(per_layer.live(pages), want) << "layer " << l << " head " << h;
          EXPECT_FLOAT_EQ(cache_->last_phi(s.id, l, h), p);
        }
      }
      ++s.pos;
    }
  }

  int reused_across_layers(const KernelInputs& in,
                           const std::vector<std::pair<int, cache::LayerEdits>>& sent) const {
    std::map<int32_t, int> owner;  // page -> the layer holding it when the step began
    const size_t per_layer = seqs_.size() * kHeads;
    for (size_t st = 0; st < in.tables.count.size(); ++st) {
      for (int c = 0; c < in.tables.count[st]; ++c) {
        owner[in.tables.ids[in.tables.offset[st] + c]] = static_cast<int>(st / per_layer);
      }
    }
    int reused = 0;
    for (int l = 0; l < kLayers; ++l) {
      for (int32_t page : sent[l].second.reset_pages) {
        auto it = owner.find(page);
        reused += it != owner.end() && it->second != l;
      }
    }
    return reused;
  }

  std::unique_ptr<cache::KvCache> cache_;
  std::vector<std::vector<float>> betas_;
  std::vector<std::span<const float>> views_;
  std::vector<Seq> seqs_;
  PoolMirror deferred_{kPages, kSlots};
};

TEST_F(DecodeStepTest, DeferredUpdateEqualsThePerLayerOrderAndTheReference) {
  std::mt19937 rng(5);
  for (int i = 0; i < 4; ++i) add_seq(120, rng);
  int reused = 0;
  for (int t = 0; t < 120 && !HasFailure(); ++t) reused += step();
  EXPECT_GT(reused, 0) << "no page changed layer within a step: the order was never tested";
  EXPECT_GT(cache_->stats().evicted_slots, 0);
}

// A fork of a device pool (the prefix cache's snapshot and hit) copies its keys on the device:
// refused while no device is attached; attached, the device receives a copy of every live key of
// the source and a reset of every page the copy took, and the copy holds its source's keys there
// and goes on exactly as its source does (check() compares every sequence's device keys with the
// reference each step). Its pages come from a released sequence whose keys the device still
// holds, so the fork must clear them first.
TEST_F(DecodeStepTest, AForkReachesTheDeviceAndGoesOnAsItsSource) {
  std::mt19937 rng(11);
  for (int i = 0; i < 2; ++i) add_seq(120, rng);
  for (int t = 0; t < 50 && !HasFailure(); ++t) step();
  ASSERT_GT(cache_->stats().evicted_slots, 0);
  cache_->release(seqs_[0].id);
  seqs_.erase(seqs_.begin());
  const cache::SeqId source = seqs_[0].id;
  cache_->attach_device(nullptr);
  EXPECT_EQ(cache_->fork(source).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache_->stats().sequences, 1);
  cache_->attach_device(&deferred_);
  deferred_.forget_received();
  const absl::StatusOr<cache::SeqId> fork = cache_->fork(source);
  ASSERT_TRUE(fork.ok()) << fork.status();
  std::vector<int32_t> fork_pages;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      const std::span<const int32_t> pages = cache_->pages(*fork, l, h);
      fork_pages.insert(fork_pages.end(), pages.begin(), pages.end());
    }
  }
  std::vector<int32_t> resets = deferred_.received().fork_resets;
  std::ranges::sort(resets);
  std::ranges::sort(fork_pages);
  EXPECT_EQ(resets, fork_pages);
  EXPECT_EQ(static_cast<int64_t>(deferred_.received().fork_copies.size()),
            cache_->sequence_stats(source).live_keys);
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      const std::set<int32_t> want = deferred_.live(cache_->pages(source, l, h));
      EXPECT_FALSE(want.empty());
      EXPECT_EQ(deferred_.live(cache_->pages(*fork, l, h)), want) << "layer " << l << " head " << h;
    }
  }
  Seq copy = seqs_[0];
  copy.id = *fork;
  seqs_.push_back(std::move(copy));
  for (int t = 50; t < 120 && !HasFailure(); ++t) step();
}

// A device pool edits nothing while no device could take the edits: the step is refused before
// the cache changes, so host and device still agree once one is attached.
TEST_F(DecodeStepTest, AStepWithoutADeviceIsRefusedAndChangesNothing) {
  const std::vector<cache::BatchItem> items = reserve_first_token(3);
  ASSERT_FALSE(HasFailure());  // the reservation
  auto layout = plan_batch(items, 259, false, kDims);
  ASSERT_TRUE(layout.ok());
  std::vector<float> phi, lvl;
  field(phi, lvl);
  const std::vector<int32_t> retired(kLayers, 0);
  cache_->attach_device(nullptr);
  const absl::Status refused =
      settle_decode(*cache_, items, *layout, views_, {phi.data(), lvl.data()}, retired);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("no device is attached"), std::string::npos) << refused;
  EXPECT_EQ(cache_->sequence_stats(items[0].seq).live_keys, 0);
  EXPECT_EQ(cache_->length(items[0].seq), 0);
  cache_->unreserve(items[0].seq);
}

TEST_F(DecodeStepTest, DisagreementWithTheDeviceStopsTheStep) {
  const std::vector<cache::BatchItem> items = reserve_first_token(9);
  ASSERT_FALSE(HasFailure());  // the reservation
  auto layout = plan_batch(items, 259, false, kDims);
  ASSERT_TRUE(layout.ok());
  const KernelInputs in = kernel_inputs(items, views_, *cache_);
  std::vector<float> phi, lvl;
  field(phi, lvl);
  std::vector<int32_t> retired(kLayers);
  for (int l = 0; l < kLayers; ++l) retired[l] = attend(deferred_, in, l, phi);
  retired[1] = 1;  // the device claims a key the cache (empty before this token) cannot evict
  const absl::Status s =
      settle_decode(*cache_, items, *layout, views_, {phi.data(), lvl.data()}, retired);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("layer 1: the cache evicted 0 keys, the device retired 1"),
            std::string::npos)
      << s;
}

TEST(DecodeStep, OnlyOneTokenItemsRunWithoutTheHost) {
  const std::vector<int32_t> one{1}, two{1, 2};
  EXPECT_TRUE(decode_only(std::vector<cache::BatchItem>{{0, one, 3}, {1, one, 7}}));
  EXPECT_FALSE(decode_only(std::vector<cache::BatchItem>{{0, one, 3}, {1, two, 0}}));
}

// The backend's queue of what the cache sends (flat_edits.h): each kind in one array, each
// layer's range in it, a decode step's writes moved to their layer's block of rows.
TEST(FlatEdits, KeepEachLayersEditsAndShiftTheirRows) {
  std::vector<cache::LayerEdits> layers(2);
  layers[0].reset_pages = {3};
  layers[0].writes = {{12, 1, 0, 5, 0.5f, 1.0f}};
  layers[1].writes = {{20, 1, 1, 5, 0.5f, 1.0f}, {21, 0, 0, 6, 0.5f, 1.0f}};
  layers[1].moves = {{21, 4}};
  FlatEdits flat;
  for (int l = 0; l < 2; ++l) flat.append(layers[l], l * 2);  // two rows a layer
  EXPECT_EQ(flat.resets, (std::vector<int32_t>{3}));
  ASSERT_EQ(flat.writes.size(), 3u);
  EXPECT_EQ(flat.writes[0].row, 1);
  EXPECT_EQ(flat.writes[1].row, 3);  // layer 1, row 1: layer * rows + row
  EXPECT_EQ(flat.writes[2].row, 2);
  ASSERT_EQ(flat.layers.size(), 2u);
  EXPECT_EQ(flat.layers[1].writes.first, 1);
  EXPECT_EQ(flat.layers[1].writes.count, 2);
  EXPECT_EQ(flat.layers[1].resets.count, 0);
  EXPECT_EQ(flat.layers[1].moves.first, 0);
  EXPECT_EQ(flat.layers[1].moves.count, 1);
  flat.clear();
  EXPECT_TRUE(flat.layers.empty() && flat.writes.empty() && flat.resets.empty());
}

}  // namespace
}  // namespace fpa::cuda
