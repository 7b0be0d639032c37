// The CUDA attention kernels launched directly (launch_attention: attention, split combine, chunk
// commit) on random page pools, against the CPU kernels on the same inputs: output rows, and the
// running minimum m and positions (dead keys freed) they leave in the pool. Decode tokens, prompt
// chunks over a cache and mixed batches; head_dim 16 to 256 (and 20); float32 and bf16 pools; the
// split count forced to 1, 3 and 64. Device tests skip when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/step_plan.h"
#include "model/bf16.h"
#include "tests/engine/parity_util.h"
#include "tests/gpu/attention_case.h"

namespace fpa::gpu_test {
namespace {

using cuda::DeviceBuffer;

// Both sides accumulate in float32 over the same (bf16-rounded where the pool is bf16) inputs; only
// the order differs (an online softmax over 32-key tiles and splits against a two-pass softmax
// with a double sum), which moves an output by a few ulps per hundred keys. A missed, doubled or
// wrongly penalised key moves it by 1e-2 or more.
constexpr double kTolerance = 2e-5;
// Rows of prompt chunks on tensor cores (bf16 pools, head_dim a multiple of 16 up to 128) take
// the query and the probabilities in bf16 for the products: 2^-8 relative each.
constexpr double kTensorCoreTolerance = 1.5e-2;

bool on_tensor_cores(int head_dim, bool bf16) {
  return bf16 && head_dim % 16 == 0 && head_dim <= 128;
}

enum class Batch { kDecode, kPrefill, kMixed };

// Five sequences over three heads (beta 0: softmax, never evicts; a weak and a strong penalty):
// emptied streams (no pages, or one page of free slots), short and long page lists (64 pages is
// one page per split at 64 splits). Chunks of 33 and 70 rows walk several 32-key tiles.
CaseSpec spec_for(int head_dim, bool bf16, Batch batch) {
  const std::vector<std::vector<int>> pages = {
      {0, 3, 1}, {kAllFreePage, 40, 7}, {12, 2, 25}, {5, 0, 9}, {1, 17, 64}};
  const std::vector<int> lens = batch == Batch::kDecode    ? std::vector<int>{1, 1, 1, 1, 1}
                                : batch == Batch::kPrefill ? std::vector<int>{5, 33, 70, 2, 40}
                                                           : std::vector<int>{1, 33, 1, 70, 1};
  std::vector<ItemSpec> items;
  for (size_t i = 0; i < pages.size(); ++i) items.push_back({lens[i], pages[i]});
  return {.head_dim = head_dim,
          .bf16 = bf16,
          .beta = {0.0f, 1.0f, 1.5f},
          .tau = 3.0f,
          .items = std::move(items),
          .seed = static_cast<uint32_t>(head_dim * 7 + bf16 * 3 + static_cast<int>(batch))};
}

template <typename T>
void must_upload(DeviceBuffer& buf, const std::vector<T>& host) {
  const absl::Status s = cuda::upload(buf, host.data(), host.size(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buf, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), buf.as<T>(), count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// bf16 keys and values as the pool stores them (the host values are already bf16-exact).
std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  to_bf16(x.data(), x.size(), out.data());
  return out;
}

struct DeviceRun {
  std::vector<float> out, m;
  std::vector<int32_t> pos;
};

// One launch of the attention kernels over a case, with `splits` forced where the backend would
// take attention_splits().
// `tensor_cores`: the prompt chunks' row tiles go with the launch, so that they take the
// tensor-core path where the pool fits it.
DeviceRun run_on_device(const AttentionCase& c, int splits, bool tensor_cores = true) {
  DeviceBuffer k, v, lvl, m, pos, qkv, phi, lvl_rows, cmin, row_item, item_row0, item_len,
      item_pos0, thr, beta, page_ids, page_off, page_cnt, partial, out, tiles;
  const std::vector<int32_t> tile_rows =
      tensor_cores ? cuda::chunk_tiles(c.item_row0, c.item_len) : std::vector<int32_t>{};
  must_upload(tiles, tile_rows);
  cuda::PoolView pool{.page_slots = c.page_slots, .head_dim = c.head_dim};
  if (c.bf16) {
    must_upload(k, bf16_bits(c.k));
    must_upload(v, bf16_bits(c.v));
    pool.type = cuda::KvType::kBf16;
  } else {
    must_upload(k, c.k);
    must_upload(v, c.v);
    pool.type = cuda::KvType::kF32;
  }
  must_upload(lvl, c.lvl);
  must_upload(m, c.m);
  must_upload(pos, c.pos);
  pool.k = k.as<void>();
  pool.v = v.as<void>();
  pool.lvl = lvl.as<float>();
  pool.m = m.as<float>();
  pool.pos = pos.as<int32_t>();
  must_upload(qkv, c.qkv);
  must_upload(phi, c.phi);
  must_upload(lvl_rows, c.lvl_rows);
  must_upload(cmin, c.cmin);
  must_upload(thr, c.thr);
  must_upload(beta, c.beta);
  must_upload(row_item, c.row_item);
  must_upload(item_row0, c.item_row0);
  must_upload(item_len, c.item_len);
  must_upload(item_pos0, c.item_pos0);
  must_upload(page_ids, c.page_ids);
  must_upload(page_off, c.page_off);
  must_upload(page_cnt, c.page_cnt);
  const size_t pairs = static_cast<size_t>(c.rows) * c.n_heads;
  EXPECT_TRUE(partial.reserve(pairs * splits * (c.head_dim + 2) * 4).ok());
  EXPECT_TRUE(out.reserve(pairs * c.head_dim * 4).ok());
  if (::testing::Test::HasFailure()) return {};  // never launch on missing buffers
  const cuda::AttentionArgs a{.qkv = qkv.as<float>(),
                              .qkv_stride = c.qkv_stride,
                              .phi = phi.as<float>(),
                              .lvl = lvl_rows.as<float>(),
                              .cmin = cmin.as<float>(),
                              .row_item = row_item.as<int32_t>(),
                              .item_row0 = item_row0.as<int32_t>(),
                              .item_len = item_len.as<int32_t>(),
                              .item_pos0 = item_pos0.as<int32_t>(),
                              .thr = thr.as<float>(),
                              .beta = beta.as<float>(),
                              .page_ids = page_ids.as<int32_t>(),
                              .page_off = page_off.as<int32_t>(),
                              .page_cnt = page_cnt.as<int32_t>(),
                              .rows = c.rows,
                              .items = c.items,
                              .n_heads = c.n_heads,
                              .splits = splits,
                              .partial = partial.as<float>(),
                              .out = out.as<float>(),
                              .tc_tiles = tiles.as<int32_t>(),
                              .n_tc_tiles = static_cast<int>(tile_rows.size())};
  const absl::Status launched = cuda::launch_attention(a, pool, nullptr);
  EXPECT_TRUE(launched.ok()) << launched;
  // A fault inside a kernel surfaces here, not at the launch.
  const cudaError_t done = cudaDeviceSynchronize();
  EXPECT_EQ(done, cudaSuccess) << cudaGetErrorString(done);
  return {download<float>(out, pairs * c.head_dim), download<float>(m, c.m.size()),
          download<int32_t>(pos, c.pos.size())};
}

// Bit for bit, NaN (free slots' minima, which nothing may write) included.
bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

using Param = std::tuple<int, int, bool, Batch>;  // head_dim, splits, bf16 pool, batch

class AttentionKernelTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_P(AttentionKernelTest, MatchesTheCpuKernels) {
  const auto [head_dim, splits, bf16, batch] = GetParam();
  const AttentionCase c = make_case(spec_for(head_dim, bf16, batch));
  const Expected want = cpu_expected(c);
  const DeviceRun got = run_on_device(c, splits);
  ASSERT_FALSE(HasFailure()) << "the device run failed";
  const int width = c.n_heads * c.head_dim;
  for (int i = 0; i < c.items; ++i) {
    const size_t from = static_cast<size_t>(c.item_row0[i]) * width;
    const size_t n = static_cast<size_t>(c.item_len[i]) * width;
    const double tol =
        c.item_len[i] > 1 && on_tensor_cores(head_dim, bf16) ? kTensorCoreTolerance : kTolerance;
    EXPECT_LE(rel_error(std::span(got.out).subspan(from, n), std::span(want.out).subspan(from, n)),
              tol)
        << "item " << i << " (" << c.item_len[i] << " rows)";
  }
  int m_diffs = 0, pos_diffs = 0;
  for (size_t s = 0; s < c.m.size(); ++s) {
    if (!same_bits(got.m[s], want.m[s]) && m_diffs++ < 5) {
      ADD_FAILURE() << "slot " << s << ": m " << got.m[s] << ", the CPU kernels leave " << want.m[s]
                    << " (was " << c.m[s] << ", pos " << c.pos[s] << ")";
    }
    if (got.pos[s] != want.pos[s] && pos_diffs++ < 5) {
      ADD_FAILURE() << "slot " << s << ": pos " << got.pos[s] << ", expected " << want.pos[s]
                    << " (was " << c.pos[s] << ", lvl - m " << c.lvl[s] - want.m[s] << ")";
    }
  }
  EXPECT_EQ(m_diffs, 0);
  EXPECT_EQ(pos_diffs, 0);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [head_dim, splits, bf16, batch] = info.param;
  const char* kind = batch == Batch::kDecode    ? "Decode"
                     : batch == Batch::kPrefill ? "Prefill"
                                                : "Mixed";
  return std::string(kind) + "_hd" + std::to_string(head_dim) + "_splits" + std::to_string(splits) +
         (bf16 ? "_bf16" : "_f32");
}

// Head dimensions 16 to 256 (kMaxHeadDim), and 20, where bf16 rows are read element by element
// instead of 16 bytes at a time.
INSTANTIATE_TEST_SUITE_P(Kernels, AttentionKernelTest,
                         ::testing::Combine(::testing::Values(16, 20, 80, 128, 256),
                                            ::testing::Values(1, 3, 64), ::testing::Bool(),
                                            ::testing::Values(Batch::kDecode, Batch::kPrefill,
                                                              Batch::kMixed)),
                         param_name);

// The tensor-core prefill against the warp kernel on the same chunks (every head size it takes
// here, prompt chunks alone and beside decode tokens): the rows within bf16's rounding of the
// products, the pool's m and pos bit for bit (the chunk commit is shared).
TEST(TensorCorePrefill, AgreesWithTheWarpKernel) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine";
  for (int head_dim : {16, 128}) {
    for (Batch batch : {Batch::kPrefill, Batch::kMixed}) {
      const AttentionCase c = make_case(spec_for(head_dim, true, batch));
      const DeviceRun tc = run_on_device(c, 1, true);
      const DeviceRun warp = run_on_device(c, 1, false);
      ASSERT_FALSE(HasFailure()) << "a device run failed";
      EXPECT_LE(rel_error(tc.out, warp.out), kTensorCoreTolerance) << "head_dim " << head_dim;
      EXPECT_EQ(tc.pos, warp.pos);
      for (size_t s = 0; s < tc.m.size(); ++s) EXPECT_TRUE(same_bits(tc.m[s], warp.m[s])) << s;
    }
  }
}

// Host only: the cases hold what the device tests claim to cover, so that a green device run
// means something (keys that die and keys that survive in every penalised head, free slots,
// emptied streams, chunks spanning several tiles, chunk keys excluded inside their own chunk).
TEST(AttentionCase, CoversWhatTheDeviceTestsClaim) {
  for (Batch batch : {Batch::kDecode, Batch::kPrefill, Batch::kMixed}) {
    const AttentionCase c = make_case(spec_for(128, false, batch));
    const Expected e = cpu_expected(c);
    std::vector<int> died(c.n_heads), survived(c.n_heads);
    int free_listed = 0, empty_streams = 0, max_pages = 0;
    for (int i = 0; i < c.items; ++i) {
      for (int h = 0; h < c.n_heads; ++h) {
        const int stream = i * c.n_heads + h;
        empty_streams += c.page_cnt[stream] == 0;
        max_pages = std::max(max_pages, c.page_cnt[stream]);
        for (int p = 0; p < c.page_cnt[stream]; ++p) {
          for (int s = 0; s < c.page_slots; ++s) {
            const size_t slot =
                static_cast<size_t>(c.page_ids[c.page_off[stream] + p]) * c.page_slots + s;
            free_listed += c.pos[slot] < 0;
            if (c.pos[slot] >= 0) (e.pos[slot] < 0 ? died : survived)[h]++;
          }
        }
      }
    }
    EXPECT_EQ(died[0], 0) << "beta 0 never evicts";
    for (int h = 1; h < c.n_heads; ++h) {
      EXPECT_GT(died[h], 0) << "head " << h;
      EXPECT_GT(survived[h], 0) << "head " << h;
    }
    EXPECT_GT(free_listed, c.page_slots);
    EXPECT_GE(empty_streams, 2);
    EXPECT_GE(max_pages, 64);
    for (float x : e.out) ASSERT_TRUE(std::isfinite(x));
    if (batch == Batch::kDecode) continue;
    EXPECT_GT(*std::max_element(c.item_len.begin(), c.item_len.end()), 64);
    int excluded_in_chunk = 0;  // key j dead for a later row r of its own chunk
    for (int i = 0; i < c.items; ++i) {
      const int row0 = c.item_row0[i], h = 2;
      for (int r = row0; r < row0 + c.item_len[i]; ++r) {
        float seg_min = INFINITY;
        for (int j = r; j >= row0; --j) {
          excluded_in_chunk += c.lvl_rows[j * c.n_heads + h] - seg_min >= c.thr[i * c.n_heads + h];
          seg_min = std::min(seg_min, c.phi[j * c.n_heads + h]);
        }
      }
    }
    EXPECT_GT(excluded_in_chunk, 0);
  }
}

// The expectation depends on the case alone (no uninitialised memory, no state the CPU kernels
// carry between calls), and the seed changes the case.
TEST(AttentionCase, ExpectationIsReproducible) {
  const CaseSpec spec = spec_for(80, true, Batch::kMixed);
  const Expected a = cpu_expected(make_case(spec));
  const Expected b = cpu_expected(make_case(spec));
  EXPECT_EQ(rel_error(a.out, b.out), 0.0);
  CaseSpec other = spec;
  other.seed += 1;
  EXPECT_GT(rel_error(cpu_expected(make_case(other)).out, a.out), 1e-2);
}

}  // namespace
}  // namespace fpa::gpu_test
