// FoX Pro's kernels' per-element work (kernels/cuda/fox_pro_ops.h) run on the host, thread by
// thread and lane by lane as the kernels split it, against the CPU backend's own pieces: the
// shift against cpu::ShiftStates through a prompt chunk and the steps after it, for two
// sequences whose slots and batch order differ; the per-head norm against cpu::rmsnorm of each
// head with the output gate after it. No device needed: these run everywhere cuda_kernel_test
// does.
#include "kernels/cuda/fox_pro_ops.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/shift_state.h"

namespace fpa::cuda {
namespace {

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 4, kWidth = kHeads * kHeadDim;
// The fused rows as the backend has them: q | k | v | ogate, and field | k gate | v gate.
constexpr int kQkvStride = 4 * kWidth, kGateStride = 3 * kHeads;

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One batch: each item a sequence's rows at its position.
struct Piece {
  int seq;  // 0 or 1
  int pos, len;
};

class ShiftColumns : public ::testing::TestWithParam<bool> {};  // whether keys shift too

TEST_P(ShiftColumns, MatchTheCpuShiftStatesAcrossSteps) {
  const bool k_shift = GetParam();
  auto cache = cache::KvCache::create({kLayers, kHeads, kHeadDim, 4}, 16);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const cache::SeqId seqs[2] = {*(*cache)->add_sequence({}), *(*cache)->add_sequence({})};
  const int32_t slot_of[2] = {1, 0};  // the slots need not follow the batch order
  cpu::ShiftStates cpu(kLayers, kWidth);
  std::vector<float> state(2 * kLayers * 2 * kWidth, 0.0f);  // [slots][layers][k, v][width]
  std::mt19937 rng(7);
  const std::vector<int32_t> tokens(8, 1);
  const int layer = 1;
  for (const std::vector<Piece>& batch : std::vector<std::vector<Piece>>{
           {{0, 0, 5}, {1, 0, 3}}, {{1, 3, 1}, {0, 5, 4}}, {{0, 9, 1}, {1, 4, 1}}}) {
    std::vector<cache::BatchItem> items;
    std::vector<int32_t> row0, len, slot;
    int rows = 0;
    for (const Piece& p : batch) {
      items.push_back({seqs[p.seq], std::span(tokens).first(p.len), p.pos});
      row0.push_back(rows);
      len.push_back(p.len);
      slot.push_back(slot_of[p.seq]);
      rows += p.len;
    }
    std::vector<float> qkv = random_floats(static_cast<size_t>(rows) * kQkvStride, rng);
    const std::vector<float> gates = random_floats(static_cast<size_t>(rows) * kGateStride, rng);
    std::vector<float> expected = qkv;
    ASSERT_TRUE(cpu.begin(items, **cache).ok());
    for (size_t i = 0; i < items.size(); ++i) {
      for (int which : {0, 1}) {
        if (which == 0 && !k_shift) continue;
        std::vector<float> y, a;  // the CPU backend's dense [len, width] and [len, heads]
        for (int r = row0[i]; r < row0[i] + len[i]; ++r) {
          const float* part = expected.data() + static_cast<size_t>(r) * kQkvStride;
          y.insert(y.end(), part + (1 + which) * kWidth, part + (2 + which) * kWidth);
          const float* g =
              gates.data() + static_cast<size_t>(r) * kGateStride + (1 + which) * kHeads;
          a.insert(a.end(), g, g + kHeads);
        }
        cpu.apply(items[i].seq, layer, which, a.data(), kHeads, y.data(), len[i]);
        for (int t = 0; t < len[i]; ++t) {
          std::copy_n(y.data() + static_cast<size_t>(t) * kWidth, kWidth,
                      expected.data() + static_cast<size_t>(row0[i] + t) * kQkvStride +
                          (1 + which) * kWidth);
        }
      }
    }
    cpu.end(items);

    ShiftArgs a;
    a.qkv = qkv.data();
    a.qkv_stride = kQkvStride;
    a.gates = gates.data();
    a.gate_stride = kGateStride;
    a.k_gate_col = k_shift ? kHeads : -1;
    a.v_gate_col = 2 * kHeads;
    a.item_row0 = row0.data();
    a.item_len = len.data();
    a.item_slot = slot.data();
    a.state = state.data();
    a.layer = layer;
    a.n_layers = kLayers;
    a.items = static_cast<int>(items.size());
    a.n_heads = kHeads;
    a.head_dim = kHeadDim;
    for (int item = 0; item < a.items; ++item) {
      for (int which : {0, 1}) {
        for (int e = 0; e < kWidth; ++e) shift_column(a, item, which, e);
      }
    }
    for (size_t i = 0; i < qkv.size(); ++i) {
      EXPECT_NEAR(qkv[i], expected[i], 1e-6f)
          << "row " << i / kQkvStride << " column " << i % kQkvStride << " at " << batch[0].pos;
    }
  }
  for (size_t i = 0; i < state.size(); ++i) {
    const int layer_of = static_cast<int>(i / (2 * kWidth) % kLayers);
    if (layer_of != layer) {
      EXPECT_EQ(state[i], 0.0f) << "another layer's rows were touched";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KeysAndValues, ShiftColumns, ::testing::Bool());

struct NormCase {
  bool weight, shared, gate, silu;
};

class HeadNorm : public ::testing::TestWithParam<NormCase> {};

// head_dim 40: more elements than lanes, so each lane takes two (and some one).
TEST_P(HeadNorm, MatchesCpuRmsnormPerHeadThenTheGate) {
  const NormCase c = GetParam();
  constexpr int kRows = 3, kNHeads = 3, kDim = 40, kStride = 2 * kNHeads * kDim;
  constexpr float kEps = 1e-5f;
  std::mt19937 rng(11);
  std::vector<float> x = random_floats(static_cast<size_t>(kRows) * kStride, rng);
  const std::vector<float> weight = random_floats(static_cast<size_t>(kNHeads) * kDim, rng);
  const std::vector<float> gate = random_floats(static_cast<size_t>(kRows) * kStride, rng);
  std::vector<float> expected = x;
  for (int r = 0; r < kRows; ++r) {
    for (int h = 0; h < kNHeads; ++h) {
      float* head = expected.data() + static_cast<size_t>(r) * kStride + h * kDim;
      if (c.weight) {
        const std::span<const float> w(weight.data() + (c.shared ? 0 : h * kDim), kDim);
        cpu::rmsnorm(head, 1, w, kEps, head);
      }
      const float* g = gate.data() + static_cast<size_t>(r) * kStride + kNHeads * kDim + h * kDim;
      for (int i = 0; c.gate && i < kDim; ++i) {
        const float sig = 1.0f / (1.0f + std::exp(-g[i]));
        head[i] *= c.silu ? g[i] * sig : sig;
      }
    }
  }
  HeadNormArgs a;
  a.x = x.data();
  a.x_stride = kStride;
  a.rows = kRows;
  a.n_heads = kNHeads;
  a.head_dim = kDim;
  a.weight = c.weight ? weight.data() : nullptr;
  a.weight_head_stride = c.shared ? 0 : kDim;
  a.eps = kEps;
  a.gate = c.gate ? gate.data() + kNHeads * kDim : nullptr;
  a.gate_stride = kStride;
  a.gate_silu = c.silu;
  for (int r = 0; r < kRows; ++r) {
    for (int h = 0; h < kNHeads; ++h) {
      float ss = 0.0f;  // as the warp sums its lanes' parts
      for (int lane = 0; lane < 32; ++lane) ss += head_sum_squares(a, r, h, lane, 32);
      for (int lane = 0; lane < 32; ++lane) head_norm_apply(a, r, h, lane, 32, ss);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], expected[i], 1e-5f * (1.0f + std::fabs(expected[i])))
        << "row " << i / kStride << " column " << i % kStride;
  }
}

INSTANTIATE_TEST_SUITE_P(Options, HeadNorm,
                         ::testing::Values(NormCase{true, false, false, false},
                                           NormCase{true, true, false, false},
                                           NormCase{true, false, true, false},
                                           NormCase{false, false, true, true},
                                           NormCase{false, false, true, false}));

}  // namespace
}  // namespace fpa::cuda
