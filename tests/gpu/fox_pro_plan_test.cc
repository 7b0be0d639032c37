// FoX Pro on the CUDA backend, host side without a device: where the fused GEMMs put each extra
// projection (projection_layout.h), checked against the published checkpoints' weights, and
// which slot of shift rows each sequence reads and updates through chunked prefill, decode,
// preemption and recompute (shift_slots.h), with the CPU backend's rules for what may continue.
#include <gtest/gtest.h>

#include <set>

#include "cache/kv_cache.h"
#include "kernels/cuda/projection_layout.h"
#include "kernels/cuda/shift_slots.h"
#include "model/model.h"
#include "tests/gpu/vectors_dir.h"

namespace fpa::cuda {
namespace {

ModelConfig fox(int heads, int head_dim) {
  ModelConfig c;
  c.n_heads = heads;
  c.head_dim = head_dim;
  c.attention = AttentionKind::kFox;
  return c;
}

TEST(ProjectionLayout, PlainModelsKeepQkvAndTheField) {
  ModelConfig c = fox(4, 8);
  ProjectionLayout p = projection_layout(c);
  EXPECT_EQ(p.attn_width, 32);
  EXPECT_EQ(p.qkv_stride, 96);
  EXPECT_EQ(p.ogate_col, -1);
  EXPECT_TRUE(p.field);
  EXPECT_EQ(p.field_stride, 4);
  EXPECT_EQ(p.level_col, -1);
  EXPECT_EQ(p.k_shift_col, -1);
  EXPECT_EQ(p.v_shift_col, -1);

  c.attention = AttentionKind::kFpa;
  c.free_levels = true;
  p = projection_layout(c);
  EXPECT_EQ(p.field_stride, 8);
  EXPECT_EQ(p.level_col, 4) << "the field kernel reads the levels right after the field";

  c.attention = AttentionKind::kSoftmax;
  c.free_levels = false;
  p = projection_layout(c);
  EXPECT_FALSE(p.field);
  EXPECT_EQ(p.field_stride, 0);
}

TEST(ProjectionLayout, FoxProAppendsTheGateAndTheShiftGates) {
  ModelConfig c = fox(4, 8);
  c.output_gate = true;
  c.k_shift = true;
  c.v_shift = true;
  ProjectionLayout p = projection_layout(c);
  EXPECT_EQ(p.ogate_col, 96);
  EXPECT_EQ(p.qkv_stride, 128);
  EXPECT_EQ(p.field_stride, 12);
  EXPECT_EQ(p.k_shift_col, 4);
  EXPECT_EQ(p.v_shift_col, 8);

  c.k_shift = false;  // a value shift alone sits right after the field
  p = projection_layout(c);
  EXPECT_EQ(p.k_shift_col, -1);
  EXPECT_EQ(p.v_shift_col, 4);
  EXPECT_EQ(p.field_stride, 8);
}

// The matrices DeviceWeights stacks land at the layout's columns, on every published case.
class PublishedLayout : public ::testing::TestWithParam<std::string> {};

TEST_P(PublishedLayout, PartsLandAtTheLayoutsColumns) {
  auto model = Model::load(vectors_dir() + "/hf/" + GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const ProjectionLayout p = projection_layout(c);
  for (const LayerWeights& w : (*model)->layers()) {
    std::vector<int> starts;
    int at = 0;
    for (const Matrix* m : qkv_parts(c, w)) {
      ASSERT_NE(m->data, nullptr);
      EXPECT_EQ(m->cols, c.d_model);
      starts.push_back(at);
      at += m->rows;
    }
    EXPECT_EQ(at, p.qkv_stride);
    const int a = p.attn_width;
    EXPECT_EQ(starts, c.output_gate ? (std::vector<int>{0, a, 2 * a, p.ogate_col})
                                    : (std::vector<int>{0, a, 2 * a}));
    std::vector<std::pair<const Matrix*, int>> field;
    at = 0;
    for (const Matrix* m : field_parts(c, w)) {
      ASSERT_NE(m->data, nullptr);
      field.emplace_back(m, at);
      at += m->rows;
    }
    EXPECT_EQ(at, p.field_stride);
    std::vector<std::pair<const Matrix*, int>> expected;
    if (p.field) expected.emplace_back(&w.field_w, 0);
    if (c.k_shift) expected.emplace_back(&w.k_shift, p.k_shift_col);
    if (c.v_shift) expected.emplace_back(&w.v_shift, p.v_shift_col);
    EXPECT_EQ(field, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Vectors, PublishedLayout,
                         ::testing::Values("fox_pro", "fox_pro_noshift", "fox_qknorm_shared",
                                           "fox_ogate_silu", "fox_llama", "transformer"));

// A shift case really shifts both parts, and the others do not: the cases cover what they claim.
TEST(PublishedLayout, FoxProShiftsKeysAndValues) {
  auto model = Model::load(vectors_dir() + "/hf/fox_pro");
  ASSERT_TRUE(model.ok()) << model.status();
  const ProjectionLayout p = projection_layout((*model)->config());
  EXPECT_GE(p.k_shift_col, 0);
  EXPECT_GE(p.v_shift_col, 0);
  EXPECT_GE(p.ogate_col, 0);
}

class ShiftSlotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cache = cache::KvCache::create({1, 2, 4, 4}, 256);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
  }
  cache::SeqId add() {
    auto seq = cache_->add_sequence({.policy = cache::Policy::kNone});
    EXPECT_TRUE(seq.ok()) << seq.status();
    return *seq;
  }
  // One item of `n` tokens at `pos`.
  cache::BatchItem item(cache::SeqId seq, int pos, int n) {
    return {seq, std::span(tokens_).subspan(0, n), pos};
  }
  absl::StatusOr<ShiftSlots::Step> begin(const std::vector<cache::BatchItem>& items) {
    return slots_.begin(items, *cache_);
  }
  // A forward that runs: begin, then end.
  ShiftSlots::Step run(const std::vector<cache::BatchItem>& items) {
    absl::StatusOr<ShiftSlots::Step> step = begin(items);
    EXPECT_TRUE(step.ok()) << step.status();
    slots_.end(items);
    return step.ok() ? *step : ShiftSlots::Step{};
  }

  std::vector<int32_t> tokens_ = std::vector<int32_t>(64, 1);
  std::unique_ptr<cache::KvCache> cache_;
  ShiftSlots slots_;
};

TEST_F(ShiftSlotsTest, NewSequencesTakeDistinctZeroedSlots) {
  const cache::SeqId a = add(), b = add();
  const ShiftSlots::Step s = run({item(a, 0, 5), item(b, 0, 1)});
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s.fresh, (std::vector<int32_t>{0, 1}));
  EXPECT_GE(s.capacity, 2);
}

// Chunks and decode steps continue from the same slot, never zeroed again.
TEST_F(ShiftSlotsTest, ChunkedPrefillAndDecodeKeepTheirSlot) {
  const cache::SeqId a = add(), b = add();
  run({item(a, 0, 7), item(b, 0, 3)});
  ShiftSlots::Step s = run({item(a, 7, 7), item(b, 3, 1)});
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(s.fresh.empty());
  s = run({item(b, 4, 1), item(a, 14, 1)});  // another order: the slots follow the sequences
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{1, 0}));
  EXPECT_TRUE(s.fresh.empty());
}

// A sequence must start where its last forward ended; a refused batch changes no slot.
TEST_F(ShiftSlotsTest, AGapOrARepeatIsRefusedAndChangesNothing) {
  const cache::SeqId a = add(), b = add();
  run({item(a, 0, 4)});
  for (int pos : {3, 5}) {
    const cache::SeqId c = add();
    absl::StatusOr<ShiftSlots::Step> s = begin({item(c, 0, 2), item(a, pos, 1)});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << "position " << pos;
    EXPECT_EQ(slots_.sequences(), 1) << "the refused batch's new sequence took no slot";
  }
  const ShiftSlots::Step s = run({item(b, 0, 1), item(a, 4, 1)});
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(s.fresh, (std::vector<int32_t>{1}));
}

// A fork, or a prefix-cache hit, has the keys of its source but not its shift rows.
TEST_F(ShiftSlotsTest, AForkCannotContinueWithoutRows) {
  const cache::SeqId a = add();
  run({item(a, 0, 5)});
  const absl::StatusOr<cache::SeqId> b = cache_->fork(a);
  ASSERT_TRUE(b.ok()) << b.status();
  const absl::StatusOr<ShiftSlots::Step> s = begin({item(*b, 5, 1)});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("shift"), std::string_view::npos) << s.status();
}

// A forward that failed (begin, no end) may be retried from the same position.
TEST_F(ShiftSlotsTest, AFailedForwardIsRetriedFromTheSamePosition) {
  const cache::SeqId a = add();
  run({item(a, 0, 4)});
  ASSERT_TRUE(begin({item(a, 4, 4)}).ok());
  const ShiftSlots::Step s = run({item(a, 4, 4)});
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{0}));
  EXPECT_TRUE(run({item(a, 8, 1)}).fresh.empty());
}

// Preempted and recomputed: from position 0 again, the same sequence's slot is zeroed; a released
// sequence's slot goes to the next new one, lowest first.
TEST_F(ShiftSlotsTest, RecomputeZeroesAndReleasedSlotsAreReused) {
  const cache::SeqId a = add(), b = add(), c = add();
  run({item(a, 0, 3), item(b, 0, 3), item(c, 0, 3)});
  ShiftSlots::Step s = run({item(b, 0, 6)});  // b recomputed from the start
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{1}));
  EXPECT_EQ(s.fresh, (std::vector<int32_t>{1}));
  cache_->release(c);
  cache_->release(a);
  const cache::SeqId d = add(), e = add();
  s = run({item(d, 0, 2), item(b, 6, 1), item(e, 0, 2)});
  EXPECT_EQ(s.item_slot, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(s.fresh, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(slots_.sequences(), 3);
}

// More sequences than slots: the capacity grows, and every slot already given stays its
// sequence's (the device buffer grows keeping its rows).
TEST_F(ShiftSlotsTest, CapacityGrowsKeepingEverySlot) {
  std::vector<cache::SeqId> seqs;
  std::vector<cache::BatchItem> first;
  for (int i = 0; i < 8; ++i) {
    seqs.push_back(add());
    first.push_back(item(seqs.back(), 0, 2));
  }
  const ShiftSlots::Step before = run(first);
  std::vector<cache::BatchItem> next;
  for (cache::SeqId s : seqs) next.push_back(item(s, 2, 1));
  for (int i = 0; i < 9; ++i) next.push_back(item(add(), 0, 1));
  const ShiftSlots::Step after = run(next);
  EXPECT_GE(after.capacity, 17);
  EXPECT_GE(after.capacity, before.capacity);
  EXPECT_TRUE(
      std::equal(before.item_slot.begin(), before.item_slot.end(), after.item_slot.begin()));
  const std::set<int32_t> distinct(after.item_slot.begin(), after.item_slot.end());
  EXPECT_EQ(distinct.size(), after.item_slot.size());
  EXPECT_LT(*distinct.rbegin(), after.capacity);
  EXPECT_EQ(after.fresh.size(), 9u);
}

}  // namespace
}  // namespace fpa::cuda
