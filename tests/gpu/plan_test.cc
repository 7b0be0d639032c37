// The CUDA backend's host bookkeeping, without a device: batch checks, and one layer's eviction,
// insertion, compaction and forks sent to an emulated device pool (pool_mirror.h, attached as the
// cache's cache::DevicePool), compared step by step with a brute-force FPA reference
// (docs/model-format.md "Eviction conventions").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "kernels/cuda/step_plan.h"
#include "tests/gpu/pool_mirror.h"

namespace fpa::cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kHeads = 2;
constexpr int kPageSlots = 4;
const ModelDims kDims{259, 1, kHeads, 4};

std::unique_ptr<cache::KvCache> make_cache(int64_t pages) {
  auto cache = cache::KvCache::create({1, kHeads, 4, kPageSlots}, pages, /*host_storage=*/false);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

cache::SeqId add(cache::KvCache& cache, cache::Policy policy, float tau = 2.0f) {
  auto seq = cache.add_sequence({.policy = policy, .tau = tau});
  EXPECT_TRUE(seq.ok()) << seq.status();
  return *seq;
}

TEST(PlanBatch, LaysOutRowsAndOutputRows) {
  auto cache = make_cache(64);
  const cache::SeqId a = add(*cache, cache::Policy::kFpa);
  const cache::SeqId b = add(*cache, cache::Policy::kNone);
  const std::vector<int32_t> ta{1, 2, 3}, tb{4};
  const cache::BatchItem items[] = {{a, ta, 0}, {b, tb, 5}};
  auto last = plan_batch(items, 2 * 259, false, kDims);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->rows, 4);
  EXPECT_EQ(last->tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(last->row_item, (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(last->row_pos, (std::vector<int32_t>{0, 1, 2, 5}));
  EXPECT_EQ(last->item_row0, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(last->out_rows, (std::vector<int32_t>{2, 3}));
  auto all = plan_batch(items, 4 * 259, true, kDims);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->out_rows, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(PlanBatch, RejectsBadBatchesWithClearErrors) {
  auto cache = make_cache(2);
  const cache::SeqId a = add(*cache, cache::Policy::kFpa);
  const std::vector<int32_t> ok{1}, empty{}, bad{300};
  auto check = [&](std::vector<cache::BatchItem> items, size_t logits, absl::StatusCode code,
                   const char* words) {
    auto r = plan_batch(items, logits, false, kDims);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
  };
  check({{a, empty, 0}}, 259, absl::StatusCode::kInvalidArgument, "no tokens");
  check({{a, bad, 0}}, 259, absl::StatusCode::kInvalidArgument, "token 300");
  check({{a, ok, 0}, {a, ok, 1}}, 2 * 259, absl::StatusCode::kInvalidArgument, "twice");
  check({{a, ok, 0}}, 258, absl::StatusCode::kInvalidArgument, "logits span");
}

TEST(CheckPolicy, AcceptsWhatTheDeviceMirrorsAndNamesTheRest) {
  for (cache::Policy p : {cache::Policy::kFpa, cache::Policy::kNone}) {
    EXPECT_TRUE(check_policy({.policy = p}).ok());
  }
  for (cache::Policy p : {cache::Policy::kWindow, cache::Policy::kSinks, cache::Policy::kH2O,
                          cache::Policy::kSnapKV, cache::Policy::kTova}) {
    absl::Status st = check_policy({.policy = p});
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(std::string(st.message()).find(cache::policy_name(p)), std::string::npos) << st;
  }
}

TEST(Thresholds, TauOverBetaOnlyWhereFpaCanEvict) {
  auto cache = make_cache(8);
  const cache::SeqId f = add(*cache, cache::Policy::kFpa, 3.0f);
  const cache::SeqId n = add(*cache, cache::Policy::kNone, 3.0f);
  const std::vector<int32_t> t{1};
  const cache::BatchItem items[] = {{f, t, 0}, {n, t, 0}};
  const std::vector<float> beta{2.0f, 0.0f};
  EXPECT_EQ(eviction_thresholds(items, beta, *cache), (std::vector<float>{1.5f, kInf, kInf, kInf}));
}

TEST(ChunkTiles, TilePromptChunksFromTheirFirstRowAndSkipDecodeTokens) {
  const std::vector<int32_t> row0{0, 1, 34, 35}, len{1, 33, 1, 16};
  EXPECT_EQ(chunk_tiles(row0, len), (std::vector<int32_t>{1, 17, 33, 35}));
  EXPECT_TRUE(chunk_tiles(std::vector<int32_t>{0, 1}, std::vector<int32_t>{1, 1}).empty());
}

TEST(AttentionSplits, FillTheDeviceButKeepAWarpTileEach) {
  EXPECT_EQ(attention_splits(8, 16384), 512);    // batch 1, 8 heads: bounded by 32 keys a part
  EXPECT_EQ(attention_splits(1024, 16384), 16);  // batch 128: 16 x 1024 warps
  EXPECT_EQ(attention_splits(100000, 16384), 1);
  EXPECT_EQ(attention_splits(8, 10), 1);
}

TEST(SyntheticWalk, KeepsTheLastKeysWithTheirRunningMinimum) {
  for (float step : {-0.5f, 0.25f}) {
    const std::vector<SyntheticKey> keys = synthetic_walk(10, 1.0f, step, 4);
    ASSERT_EQ(keys.size(), 4u);
    for (size_t i = 0; i < keys.size(); ++i) {
      const int t = 6 + static_cast<int>(i);
      EXPECT_EQ(keys[i].offset, t);
      EXPECT_FLOAT_EQ(keys[i].lvl, 1.0f + step * (t + 1));
      float m = kInf;  // min of phi over the tokens after t
      for (int u = t + 1; u < 10; ++u) m = std::min(m, 1.0f + step * (u + 1));
      EXPECT_FLOAT_EQ(keys[i].m, m) << "step " << step << " t " << t;
    }
  }
  EXPECT_EQ(synthetic_walk(3, 0.0f, -1.0f, 8).size(), 3u);
}

// Brute force per stream: the live keys' levels, evicted step by step.
struct Reference {
  std::map<int32_t, float> live;  // pos -> lvl
  void step(int32_t pos, float phi, float lvl, float thr) {
    std::erase_if(live, [&](const auto& kv) { return kv.second - phi >= thr; });
    live[pos] = lvl;
  }
  std::set<int32_t> positions() const {
    std::set<int32_t> out;
    for (const auto& kv : live) out.insert(kv.first);
    return out;
  }
};

// A sequence's field per head: a random walk with free levels.
struct Walk {
  std::vector<float> phi[kHeads], lvl[kHeads];
  Walk(int n, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-1.0f, 0.6f), u(-1.0f, 1.0f);
    for (int h = 0; h < kHeads; ++h) {
      float p = 0.0f;
      for (int t = 0; t < n; ++t) {
        p += d(rng);
        phi[h].push_back(p);
        lvl[h].push_back(p + u(rng));
      }
    }
  }
};

struct Seq {
  Seq(cache::SeqId id, Walk walk) : id(id), walk(std::move(walk)) {}
  cache::SeqId id;
  Walk walk;
  std::vector<int> chunks;  // prompt chunks, then decode steps
  size_t next = 0;
  int32_t pos = 0;
  Reference ref[kHeads];
  std::vector<int32_t> tokens;
};

// Field rows of one step as the device's field kernel computes them ([row][head]).
struct Rows {
  std::vector<float> phi, lvl, cmin;
  cache::LayerRows view() const {
    return {.phi = phi.data(), .lvl = lvl.data(), .row_stride = kHeads, .head_stride = 1};
  }
};

Rows field_rows(const std::vector<Seq*>& seqs, const BatchLayout& layout) {
  Rows r;
  for (auto* v : {&r.phi, &r.lvl, &r.cmin}) v->resize(layout.rows * kHeads);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int row0 = layout.item_row0[i], len = layout.item_len[i];
    for (int h = 0; h < kHeads; ++h) {
      float run = kInf;
      for (int t = 0; t < len; ++t) {
        const size_t at = static_cast<size_t>(row0 + t) * kHeads + h;
        r.phi[at] = seqs[i]->walk.phi[h][seqs[i]->pos + t];
        r.lvl[at] = seqs[i]->walk.lvl[h][seqs[i]->pos + t];
        run = std::min(run, r.phi[at]);
        r.cmin[at] = run;
      }
    }
  }
  return r;
}

class MirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = make_cache(40);
    mirror_ = std::make_unique<PoolMirror>(40, kPageSlots);
    cache_->attach_device(mirror_.get());  // the only way the mirror learns the cache's edits
  }

  std::unique_ptr<Seq> start(cache::Policy policy, int n, std::mt19937& rng) {
    auto s = std::make_unique<Seq>(add(*cache_, policy, tau_), Walk(n, rng));
    std::uniform_int_distribution<int> chunk(2, 9);
    int left = n;
    while (left > n / 2) left -= s->chunks.emplace_back(std::min(left - n / 2, chunk(rng)));
    s->chunks.insert(s->chunks.end(), left, 1);
    s->tokens.assign(n, 65);
    return s;
  }

  // One forward step's bookkeeping for the sequences that still have chunks.
  void step(const std::vector<Seq*>& seqs) {
    std::vector<cache::BatchItem> items;
    for (Seq* s : seqs) {
      const int len = s->chunks[s->next];
      items.push_back({s->id, std::span(s->tokens).subspan(s->pos, len), s->pos});
    }
    auto layout = plan_batch(items, items.size() * 259, false, kDims);
    ASSERT_TRUE(layout.ok()) << layout.status();
    for (const cache::BatchItem& item : items) {
      ASSERT_TRUE(cache_->reserve(item.seq, static_cast<int>(item.tokens.size())));
    }
    const Rows rows = field_rows(seqs, *layout);
    const std::vector<float> thr = eviction_thresholds(items, beta_, *cache_);
    const PageTables tables = snapshot_page_tables(items, 0, kHeads, *cache_);
    for (size_t i = 0; i < items.size(); ++i) {
      for (int h = 0; h < kHeads; ++h) {
        const size_t st = i * kHeads + h;
        const int last = layout->item_row0[i] + layout->item_len[i] - 1;
        mirror_->attend(std::span(tables.ids).subspan(tables.offset[st], tables.count[st]),
                        items[i].start_pos, rows.cmin[last * kHeads + h], thr[st]);
      }
    }
    mirror_->forget_received();
    auto evicted = cache::apply_layer(*cache_, 0, items, beta_, rows.view());
    ASSERT_TRUE(evicted.ok()) << evicted.status();
    for (const cache::BatchItem& item : items) cache_->unreserve(item.seq);
    EXPECT_EQ(cache_->stats().pages_reserved, 0);
    ASSERT_EQ(mirror_->received().layers.size(), 1u);
    moves_ += mirror_->received().layers[0].second.moves.size();
    resets_ += mirror_->received().layers[0].second.reset_pages.size();
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = *seqs[i];
      int64_t live = 0;
      for (int h = 0; h < kHeads; ++h) {
        for (int t = 0; t < layout->item_len[i]; ++t) {
          s.ref[h].step(s.pos + t, s.walk.phi[h][s.pos + t], s.walk.lvl[h][s.pos + t],
                        thr[i * kHeads + h]);
        }
        const std::set<int32_t> ours = mirror_->live(cache_->pages(s.id, 0, h));
        EXPECT_EQ(ours, s.ref[h].positions()) << "seq " << s.id << " head " << h << " at " << s.pos;
        EXPECT_FLOAT_EQ(cache_->last_phi(s.id, 0, h),
                        s.walk.phi[h][s.pos + layout->item_len[i] - 1]);
        live += static_cast<int64_t>(ours.size());
      }
      EXPECT_EQ(cache_->sequence_stats(s.id).live_keys, live) << "seq " << s.id;
      s.pos += layout->item_len[i];
      ++s.next;
    }
  }

  void run(std::vector<std::unique_ptr<Seq>>& seqs) {
    for (;;) {
      std::vector<Seq*> active;
      for (auto& s : seqs) {
        if (s->next < s->chunks.size()) active.push_back(s.get());
      }
      if (active.empty()) return;
      step(active);
      if (HasFatalFailure()) return;
    }
  }

  float tau_ = 2.0f;
  std::vector<float> beta_{1.0f, 0.5f};
  std::unique_ptr<PoolMirror> mirror_;
  std::unique_ptr<cache::KvCache> cache_;
  size_t moves_ = 0, resets_ = 0;
};

TEST_F(MirrorTest, DevicePoolFollowsTheCacheThroughChunksDecodeAndCompaction) {
  std::mt19937 rng(7);
  for (int round = 0; round < 4; ++round) {  // released pages are reused by the next round
    std::vector<std::unique_ptr<Seq>> seqs;
    seqs.push_back(start(cache::Policy::kFpa, 60, rng));
    seqs.push_back(start(cache::Policy::kFpa, 45, rng));
    seqs.push_back(start(cache::Policy::kNone, 20, rng));
    run(seqs);
    for (auto& s : seqs) cache_->release(s->id);
  }
  EXPECT_GT(resets_, 0u);
  EXPECT_GT(moves_, 0u) << "the walk should leave sparse pages to compact";
}

// The prefix cache's snapshot and hit are forks of the device pool: the mirror learns them
// through the same interface, on pages a released sequence left keys on, and the hit goes on
// exactly as the sequence it was cached from (step() checks every sequence's device keys against
// the reference).
TEST_F(MirrorTest, DevicePoolFollowsThePrefixCachesSnapshotAndHit) {
  std::mt19937 rng(13);
  std::vector<std::unique_ptr<Seq>> seqs;
  seqs.push_back(start(cache::Policy::kFpa, 30, rng));
  run(seqs);
  cache_->release(seqs[0]->id);
  seqs.clear();
  std::unique_ptr<Seq> a = start(cache::Policy::kFpa, 40, rng);
  while (a->chunks[a->next] > 1 && !HasFatalFailure()) step({a.get()});
  ASSERT_FALSE(HasFatalFailure());
  const cache::PolicyConfig policy{.policy = cache::Policy::kFpa, .tau = tau_};
  const std::span<const int32_t> prompt = std::span(a->tokens).first(a->pos);
  cache::PrefixCache prefixes(*cache_, 20);
  mirror_->forget_received();
  ASSERT_TRUE(prefixes.offer(a->id, prompt, policy));
  const std::optional<cache::PrefixCache::Hit> hit = prefixes.take(prompt, policy);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, a->pos);
  EXPECT_FALSE(mirror_->received().fork_copies.empty());
  EXPECT_FALSE(mirror_->received().fork_resets.empty());
  auto b = std::make_unique<Seq>(*a);
  b->id = hit->seq;
  seqs.push_back(std::move(a));
  seqs.push_back(std::move(b));
  run(seqs);
  for (auto& s : seqs) cache_->release(s->id);
}

TEST_F(MirrorTest, KeysDyingInsideTheirChunkAreNeverInserted) {
  std::mt19937 rng(11);
  auto s = start(cache::Policy::kFpa, 12, rng);
  s->chunks = {12};
  // A walk that falls fast: most of the chunk's keys are dead by its end.
  for (int h = 0; h < kHeads; ++h) {
    for (int t = 0; t < 12; ++t) s->walk.phi[h][t] = s->walk.lvl[h][t] = -3.0f * t;
  }
  std::vector<std::unique_ptr<Seq>> seqs;
  seqs.push_back(std::move(s));
  run(seqs);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_EQ(seqs[0]->ref[h].positions().size(), h == 0 ? 1u : 2u);  // thr 2, then 4
  }
}

}  // namespace
}  // namespace fpa::cuda
