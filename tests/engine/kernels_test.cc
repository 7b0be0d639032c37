// CPU kernels against direct, unoptimised formulas (double precision where it matters).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/bf16_linear.h"
#include "kernels/cpu/field.h"
#include "kernels/cpu/int8_amx.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/thread_pool.h"
#include "model/bf16.h"

namespace fpa::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> randn(size_t n, uint32_t seed, float std = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Ops, LinearMatchesTheDefinition) {
  // n = 4 is enough work to split over threads (kMinParallelWork); the odd width leaves a tail.
  for (int n : {1, 4}) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const int in = 256, out = 1030;
      const std::vector<float> x = randn(n * in, 1), w = randn(out * in, 2);
      std::vector<float> y(n * out, 1.0f);
      linear(x.data(), n, Matrix{w.data(), out, in}, y.data(), &pool, /*accumulate=*/true);
      for (int t = 0; t < n; ++t) {
        for (int o = 0; o < out; ++o) {
          double ref = 1.0;
          for (int i = 0; i < in; ++i) ref += double(x[t * in + i]) * w[o * in + i];
          EXPECT_NEAR(y[t * out + o], ref, 1e-4) << n << " " << threads;
        }
      }
    }
  }
}

// Rounds to bf16 (nearest even) and back: values a bf16 product takes exactly.
std::vector<float> bf16_exact(std::vector<float> v) {
  for (float& x : v) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    x = std::bit_cast<float>(((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16);
  }
  return v;
}

// Inputs that bf16 holds exactly give the float32 products up to the order of the sums; token
// counts 1 to 9, 40 and 300 take oneDNN's kernels for small and large products, 1030 rows a
// block tail, 200 columns a padded activation row.
TEST(Ops, LinearBf16MatchesTheDefinitionOnBf16Values) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const int in = 200, out = 1030;
  const std::vector<float> w = bf16_exact(randn(out * in, 2));
  const Bf16Matrix wb(Matrix{w.data(), out, in});
  // oneDNN's AVX512-BF16 layout, which the one-token kernel reads (n = 1 below).
  EXPECT_GT(wb.block(), 0);
  for (int n : {1, 2, 3, 4, 5, 9, 40, 300}) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const std::vector<float> x = bf16_exact(randn(n * in, 1));
      std::vector<float> y(n * out, 1.0f);
      linear_bf16(x.data(), n, wb, y.data(), &pool, /*accumulate=*/true);
      for (int t = 0; t < n; ++t) {
        for (int o = 0; o < out; ++o) {
          double ref = 1.0;
          for (int i = 0; i < in; ++i) ref += double(x[t * in + i]) * w[o * in + i];
          ASSERT_NEAR(y[t * out + o], ref, 1e-4) << n << " " << threads << " " << t << " " << o;
        }
      }
    }
  }
}

// Any float32 input: within bf16's rounding of both factors (2^-8 relative each, at most).
TEST(Ops, LinearBf16RoundsWithinBf16Precision) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const int n = 3, in = 96, out = 70;
  const std::vector<float> x = randn(n * in, 5), w = randn(out * in, 6);
  std::vector<float> y(n * out);
  linear_bf16(x.data(), n, Bf16Matrix(Matrix{w.data(), out, in}), y.data(), nullptr);
  for (int t = 0; t < n; ++t) {
    for (int o = 0; o < out; ++o) {
      double ref = 0, bound = 0;
      for (int i = 0; i < in; ++i) {
        ref += double(x[t * in + i]) * w[o * in + i];
        bound += std::fabs(double(x[t * in + i]) * w[o * in + i]) * 2 * std::ldexp(1.0, -8);
      }
      EXPECT_NEAR(y[t * out + o], ref, bound + 1e-5);
      EXPECT_NE(y[t * out + o], 0.0f);
    }
  }
}

// Any float32 input: within the rounding of both factors to their int8 grids, each at most half
// a step (the row's or token's largest magnitude / 127 / 2). Token counts 1 to 40 take the
// hand-written kernel (up to 8) and oneDNN's; 1030 rows a block tail; 200 and 77 columns a
// padded quad, 77 a partial one.
TEST(Ops, LinearInt8WithinQuantizationBound) {
  if (!cpu_has_vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  for (int in : {200, 77}) {
    const int out = 1030;
    const std::vector<float> w = randn(out * in, 2);
    const Int8Matrix wq(Matrix{w.data(), out, in});
    EXPECT_GT(wq.block(), 0);  // oneDNN's VNNI layout, which the small-batch kernel reads
    for (int n = 1; n <= 40; n += n < 10 ? 1 : 10) {
      ThreadPool pool(1 + n % 2);
      const std::vector<float> x = randn(n * in, 1);
      std::vector<float> y(n * out, 1.0f);
      linear_int8(x.data(), n, wq, y.data(), &pool, /*accumulate=*/true);
      for (int t = 0; t < n; ++t) {
        const float* xr = x.data() + t * in;
        const double sx =
            std::fabs(*std::max_element(
                xr, xr + in, [](float a, float b) { return std::fabs(a) < std::fabs(b); })) /
            127;
        for (int o = 0; o < out; ++o) {
          const float* wr = w.data() + o * in;
          const double sw =
              std::fabs(*std::max_element(
                  wr, wr + in, [](float a, float b) { return std::fabs(a) < std::fabs(b); })) /
              127;
          double ref = 1.0, bound = 1e-4;
          for (int i = 0; i < in; ++i) {
            ref += double(xr[i]) * wr[i];
            bound += 0.5 * std::fabs(xr[i]) * sw + 0.5 * std::fabs(wr[i]) * sx + 0.75 * sx * sw;
          }
          ASSERT_NEAR(y[t * out + o], ref, bound) << in << " " << n << " " << t << " " << o;
        }
      }
    }
  }
}

// Weights already on the int8 grid (as a quantized file holds them) and activations on theirs:
// the product is the integers' exactly, whichever kernel runs it.
void expect_int8_exact_on_grid(int in) {
  const int out = 70;
  std::vector<int8_t> q(out * in);
  std::vector<float> scale(out);
  std::mt19937 rng(7);
  for (int8_t& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  for (int o = 0; o < out; ++o) scale[o] = std::ldexp(1.0f, -static_cast<int>(o % 5));
  const Int8Matrix wq(Matrix{.rows = out, .cols = in, .i8 = q.data(), .scale = scale.data()});
  // Some token counts through oneDNN too (gemv_tokens 0), where the kernel would take them, and
  // through the kernel without AMX tiles; 300 tokens quantized in blocks of rows, on both threads
  // where the row is long enough.
  ThreadPool pool(2);
  constexpr Int8Route kOneDnn{.gemv_tokens = 0};
  for (auto [n, route] : {std::pair{1, Int8Route{}},
                          {5, {}},
                          {8, {}},
                          {13, {}},
                          {25, {}},
                          {33, {}},
                          {kInt8GemvTokens, {}},
                          {300, {}},
                          {8, kInt8NoTiles},
                          {33, kInt8NoTiles},
                          {1, kOneDnn},
                          {5, kOneDnn},
                          {33, kOneDnn}}) {
    std::vector<float> x(n * in);
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 255) - 127);
    for (int t = 0; t < n; ++t) x[t * in] = 127;  // each token's scale exactly 1
    std::vector<float> y(n * out);
    linear_int8(x.data(), n, wq, y.data(), &pool, false, route);
    for (int t = 0; t < n; ++t) {
      for (int o = 0; o < out; ++o) {
        long ref = 0;
        for (int i = 0; i < in; ++i) ref += static_cast<long>(x[t * in + i]) * q[o * in + i];
        ASSERT_EQ(y[t * out + o], static_cast<float>(ref) * scale[o])
            << in << " " << n << " " << t << " " << o;
      }
    }
  }
}

TEST(Ops, LinearInt8IsExactOnItsGrid) {
  if (!cpu_has_vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  // Rows of 131 inputs (not a whole number of quads) and of 600 (150 quads, each token tile
  // reading the block again while the next one is fetched).
  for (const int in : {131, 600}) expect_int8_exact_on_grid(in);
}

// The hand-written kernel's AMX tiles and its vpdpbusd passes add the same int32 sums: the same
// outputs to the bit, for every tile split of 1 to 40 tokens (the last tile shorter), block tails
// and padded quads.
TEST(Ops, LinearInt8TilesEqualVnni) {
  if (!cpu_has_amx_int8()) GTEST_SKIP() << "no AMX-INT8 on this CPU (or the OS refuses it)";
  ThreadPool pool(2);
  for (int in : {200, 2048}) {
    const int out = 1030;
    const std::vector<float> w = randn(out * in, 80);
    const Int8Matrix wq(Matrix{w.data(), out, in});
    for (int n = 1; n <= 40; n += n < 18 ? 1 : 11) {
      const std::vector<float> x = randn(n * in, 81 + n);
      std::vector<float> tiles(n * out, 0.25f), vnni(n * out, 0.25f);
      linear_int8(x.data(), n, wq, tiles.data(), &pool, true, {.amx_tokens = 1});
      linear_int8(x.data(), n, wq, vnni.data(), &pool, true, kInt8NoTiles);
      ASSERT_EQ(tiles, vnni) << in << " " << n;
    }
  }
}

// Several matrices of one input in one call (a layer's q, k, v): each output exactly as its own
// call gives it, blocks of the different matrices sharing the pool's passes (row counts that are
// and are not multiples of 64, an output that accumulates), through the hand-written kernel and
// past it (oneDNN).
TEST(Ops, LinearInt8OfSeveralMatricesEqualsEachAlone) {
  if (!cpu_has_vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  const int in = 200;
  const std::vector<int> rows = {130, 64, 257};
  std::vector<std::vector<float>> w;
  std::vector<Int8Matrix> wq;
  for (size_t i = 0; i < rows.size(); ++i) w.push_back(randn(rows[i] * in, 50 + i));
  for (size_t i = 0; i < rows.size(); ++i) wq.emplace_back(Matrix{w[i].data(), rows[i], in});
  ThreadPool pool(2);
  for (int n : {1, 3, 8, 12, 70}) {
    const std::vector<float> x = randn(n * in, 60 + n);
    std::vector<std::vector<float>> alone, joint;
    std::vector<Int8Output> outs;
    for (size_t i = 0; i < rows.size(); ++i) {
      alone.emplace_back(n * rows[i], 0.5f);
      joint.emplace_back(n * rows[i], 0.5f);
      linear_int8(x.data(), n, wq[i], alone[i].data(), &pool, /*accumulate=*/i == 1);
      outs.push_back({&wq[i], joint[i].data(), i == 1});
    }
    linear_int8(x.data(), n, outs, &pool);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(joint[i], alone[i]) << n << " " << i;
  }
}

// Decode streams every weight once a step: the packed copies start on a 2 MiB page (and are
// advised as huge pages, cache/huge_pages.h), not wherever oneDNN's allocator put them.
TEST(Ops, PackedWeightsStartOnAHugePage) {
  const int rows = 2048, cols = 1024;  // 2 MiB of int8, 4 of bf16
  const std::vector<float> w = randn(static_cast<size_t>(rows) * cols, 70);
  const auto start = [](const dnnl::memory& m) {
    return reinterpret_cast<uintptr_t>(m.get_data_handle()) % (uintptr_t{2} << 20);
  };
  if (cpu_has_vnni()) {
    EXPECT_EQ(start(Int8Matrix(Matrix{w.data(), rows, cols}).packed()), 0u);
  }
  if (cpu_has_bf16()) {
    EXPECT_EQ(start(Bf16Matrix(Matrix{w.data(), rows, cols}).packed()), 0u);
  }
}

TEST(Ops, RmsNormAndSwiGlu) {
  const std::vector<float> x = randn(2 * 8, 3), w = randn(8, 4);
  std::vector<float> y(16);
  rmsnorm(x.data(), 2, w, 1e-5f, y.data());
  for (int t = 0; t < 2; ++t) {
    double ss = 0;
    for (int i = 0; i < 8; ++i) ss += double(x[t * 8 + i]) * x[t * 8 + i];
    for (int i = 0; i < 8; ++i) {
      EXPECT_NEAR(y[t * 8 + i], x[t * 8 + i] / std::sqrt(ss / 8 + 1e-5) * w[i], 1e-5);
    }
  }
  std::vector<float> g = {-2.0f, 0.0f, 3.0f}, u = {1.0f, 5.0f, -1.0f};
  swiglu(g.data(), u.data(), 3);
  EXPECT_NEAR(g[0], -2.0 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_NEAR(g[2], -3.0 / (1 + std::exp(-3.0)), 1e-6);
}

// A row long enough for the vector sums (blocks of 64, then of 16, then a tail of 7), against
// the definition in double.
TEST(Ops, RmsNormOfALongRowMatchesTheDefinition) {
  const int d = 2048 + 16 + 7;
  const std::vector<float> x = randn(3 * d, 5), w = randn(d, 6);
  std::vector<float> y(x.size());
  rmsnorm(x.data(), 3, w, 1e-5f, y.data());
  for (int t = 0; t < 3; ++t) {
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += double(x[t * d + i]) * x[t * d + i];
    for (int i = 0; i < d; ++i) {
      const double ref = x[t * d + i] / std::sqrt(ss / d + 1e-5) * w[i];
      ASSERT_NEAR(y[t * d + i], ref, 1e-5 * std::max(1.0, std::fabs(ref))) << t << " " << i;
    }
  }
}

// The vector path (16 at a time) against the definition, over gates from -100 to 100 (where
// exp(-g) would overflow) and a tail of 7.
TEST(Ops, SwiGluVectorPathMatchesTheDefinition) {
  std::vector<float> g(39), u = randn(39, 8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = -100.0f + 200.0f * static_cast<float>(i) / 38;
  g[5] = 0.3f, g[6] = -0.7f, g[20] = 8.0f;
  std::vector<float> out = g;
  swiglu(out.data(), u.data(), static_cast<long>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double ref = g[i] / (1 + std::exp(-double(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * std::max(1.0, std::fabs(ref))) << g[i];
  }
}

// A token's heads rotated together equal each head rotated alone.
TEST(Ops, RopeOfSeveralHeadsEqualsEachHeadAlone) {
  const int heads = 3, dim = 8, stride = 10;
  const std::vector<float> x0 = randn(heads * stride, 9);
  std::vector<float> all = x0;
  rope(all.data(), heads, stride, dim, 77, 10000.0f);
  for (int h = 0; h < heads; ++h) {
    std::vector<float> one(x0.begin() + h * stride, x0.begin() + h * stride + dim);
    rope(one.data(), 1, dim, dim, 77, 10000.0f);
    for (int i = 0; i < dim; ++i) EXPECT_EQ(all[h * stride + i], one[i]);
    EXPECT_EQ(all[h * stride + dim], x0[h * stride + dim]);  // outside the head: untouched
  }
}

TEST(Ops, RopeIsARelativeRotation) {
  const std::vector<float> q0 = randn(16, 5), k0 = randn(16, 6);
  auto dot_at = [&](int pq, int pk) {
    std::vector<float> q = q0, k = k0;
    rope(q.data(), 1, 16, 16, pq, 10000.0f);
    rope(k.data(), 1, 16, 16, pk, 10000.0f);
    double s = 0;
    for (int i = 0; i < 16; ++i) s += double(q[i]) * k[i];
    return s;
  };
  EXPECT_NEAR(dot_at(9, 4), dot_at(105, 100), 1e-4);
  std::vector<float> q = q0;
  rope(q.data(), 1, 16, 16, 3, 10000.0f);
  // Pair (0, 8) turns by angle 3 (inv_freq 1).
  EXPECT_NEAR(q[0], q0[0] * std::cos(3.0) - q0[8] * std::sin(3.0), 1e-5);
  EXPECT_NEAR(q[8], q0[8] * std::cos(3.0) + q0[0] * std::sin(3.0), 1e-5);
}

TEST(Field, WalkAndLevels) {
  // Two heads, three tokens; d_raw and u are [t][h].
  const std::vector<float> d = {0.5f, -1.0f, -2.0f, 30.0f, 1.0f, -50.0f};
  const std::vector<float> u = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  float phi[3], lvl[3];
  field_walk(AttentionKind::kFpa, d.data(), u.data(), 3, 2, 0, 1.0f, phi, lvl);
  EXPECT_FLOAT_EQ(phi[0], 1.5f);
  EXPECT_FLOAT_EQ(phi[1], -0.5f);
  EXPECT_FLOAT_EQ(phi[2], 0.5f);
  EXPECT_FLOAT_EQ(lvl[2], 1.0f);
  field_walk(AttentionKind::kFox, d.data(), nullptr, 3, 2, 1, 0.0f, phi, lvl);
  const double ls1 = -std::log1p(std::exp(1.0)), ls2 = -std::log1p(std::exp(-30.0));
  EXPECT_NEAR(phi[0], ls1, 1e-6);
  EXPECT_NEAR(phi[1], ls1 + ls2, 1e-6);
  EXPECT_NEAR(phi[2], ls1 + ls2 - 50.0, 1e-5);  // logsigmoid(-50) = -50 without overflow
  EXPECT_EQ(lvl[2], phi[2]);
}

// Keys in host pages, as the cache would hold them.
struct Pages {
  int slots, dim;
  std::vector<float> k, v, lvl, m, acc;
  std::vector<int32_t> pos;
  std::vector<uint16_t> k16, v16;  // bf16 pages (as_bf16)
  std::vector<cache::PageView> views;
  Pages(int pages, int slots, int dim)
      : slots(slots),
        dim(dim),
        k(pages * slots * dim),
        v(k.size()),
        lvl(pages * slots),
        m(lvl.size(), kInf),
        acc(lvl.size()),
        pos(lvl.size(), -1) {
    make_views();
  }
  Pages(const Pages& o) : Pages(o.pos.size() / o.slots, o.slots, o.dim) {
    k = o.k, v = o.v, lvl = o.lvl, m = o.m, acc = o.acc, pos = o.pos;
  }
  void make_views() {
    views.clear();
    for (size_t s = 0; s < pos.size(); s += slots) {
      cache::PageView view{&k[s * dim], &v[s * dim], &lvl[s], &m[s], &acc[s], &pos[s]};
      if (!k16.empty())
        view.k = view.v = nullptr, view.k16 = &k16[s * dim], view.v16 = &v16[s * dim];
      views.push_back(view);
    }
  }
  // k and v rounded to bf16 in place; with `pages`, the views become bf16 pages of them.
  void round_to_bf16(bool pages) {
    for (std::vector<float>* x : {&k, &v}) {
      for (float& f : *x) f = through_bf16(f);
    }
    if (pages) {
      k16.resize(k.size()), v16.resize(v.size());
      fpa::to_bf16(k.data(), k.size(), k16.data());
      fpa::to_bf16(v.data(), v.size(), v16.data());
    }
    make_views();
  }
  void put(int at, int32_t position, const float* kk, const float* vv, float level, float mm) {
    std::copy_n(kk, dim, &k[at * dim]);
    std::copy_n(vv, dim, &v[at * dim]);
    pos[at] = position, lvl[at] = level, m[at] = mm;
  }
  CachedKeys keys() const { return {views, slots, {}}; }
};

// out = softmax_j(q.k_j/sqrt(dim) - beta*max(0, lvl_j - m_j)) v_j over the given keys.
std::vector<double> direct(const float* q, const std::vector<const float*>& ks,
                           const std::vector<const float*>& vs, const std::vector<double>& pen,
                           int dim) {
  std::vector<double> s(ks.size()), out(dim);
  double mx = -1e300, z = 0;
  for (size_t j = 0; j < ks.size(); ++j) {
    for (int i = 0; i < dim; ++i) s[j] += double(q[i]) * ks[j][i];
    s[j] = s[j] / std::sqrt(double(dim)) - pen[j];
    mx = std::max(mx, s[j]);
  }
  for (double& x : s) z += x = std::exp(x - mx);
  for (size_t j = 0; j < ks.size(); ++j)
    for (int i = 0; i < dim; ++i) out[i] += s[j] / z * vs[j][i];
  return out;
}

// Penalty of a key with excess lvl - m: +inf when the eviction rule excludes it.
double pen_of(float beta, float excess, float threshold) {
  return excess >= threshold ? INFINITY : beta * std::max(0.0f, excess);
}

// head_dim 8 takes the generic kernel, 16 and 64 the vectorised ones.
class DecodeTest : public ::testing::TestWithParam<int> {};

TEST_P(DecodeTest, MatchesTheDefinitionAndUpdatesM) {
  const int dim = GetParam(), n = 11;
  const std::vector<float> k = randn(n * dim, 7), v = randn(n * dim, 8), q = randn(dim, 9);
  const std::vector<float> lvl = randn(n, 10);
  Pages pages(3, 4, dim);
  const float phi = -0.3f, beta = 1.7f;
  std::vector<const float*> ks, vs;
  std::vector<double> pen;
  for (int j = 0; j < n; ++j) {  // slots out of position order, with a hole at 5
    const int at = j < 5 ? j : j + 1;
    const float m = 0.1f * j - 0.5f;
    // The last key is the query's own: not cached, never penalised.
    if (j < n - 1) pages.put(at, j, &k[j * dim], &v[j * dim], lvl[j], m);
    ks.push_back(&k[j * dim]);
    vs.push_back(&v[j * dim]);
    pen.push_back(j == n - 1 ? 0.0 : beta * std::max(0.0f, lvl[j] - std::min(m, phi)));
  }
  std::vector<float> out(dim);
  const OwnKey own{&k[(n - 1) * dim], &v[(n - 1) * dim]};
  const float own_p =
      decode_attention(q.data(), phi, own, Penalty{beta}, dim, pages.keys(), out.data());
  const std::vector<double> ref = direct(q.data(), ks, vs, pen, dim);
  for (int i = 0; i < dim; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5);
  double total = own_p;
  for (int at = 0; at < 12; ++at) {
    if (pages.pos[at] < 0) continue;
    total += pages.acc[at];
    const int j = pages.pos[at];
    EXPECT_EQ(pages.m[at], std::min(0.1f * j - 0.5f, phi));
  }
  EXPECT_GT(own_p, 0.0f);
  EXPECT_NEAR(total, 1.0, 1e-5);
}

// A threshold that excludes some keys, and a policy that needs no attention mass: the excluded
// keys get no weight and acc is left as it was.
TEST_P(DecodeTest, ExcludesKeysAndLeavesAccWithoutMass) {
  const int dim = GetParam(), n = 40;
  const std::vector<float> k = randn(n * dim, 21), v = randn(n * dim, 22), q = randn(dim, 23);
  const std::vector<float> lvl = randn(n, 24);
  Pages pages(4, 16, dim);
  const float phi = -0.2f, beta = 1.3f, threshold = 0.6f;
  std::vector<const float*> ks, vs;
  std::vector<double> pen;
  for (int j = 0; j < n; ++j) {
    const int at = j < 20 ? j : j + 7;  // an emptied stretch between the keys
    if (j < n - 1) pages.put(at, j, &k[j * dim], &v[j * dim], lvl[j], 0.05f * j - 1.0f);
    ks.push_back(&k[j * dim]);
    vs.push_back(&v[j * dim]);
    pen.push_back(j == n - 1 ? 0.0
                             : pen_of(beta, lvl[j] - std::min(0.05f * j - 1.0f, phi), threshold));
  }
  ASSERT_GT(std::count(pen.begin(), pen.end(), INFINITY), 0);
  std::fill(pages.acc.begin(), pages.acc.end(), 0.25f);
  CachedKeys keys = pages.keys();
  keys.mass.mode = cache::MassRule::Mode::kNone;
  std::vector<float> out(dim);
  const OwnKey own{&k[(n - 1) * dim], &v[(n - 1) * dim]};
  const float own_p =
      decode_attention(q.data(), phi, own, Penalty{beta, threshold}, dim, keys, out.data());
  const std::vector<double> ref = direct(q.data(), ks, vs, pen, dim);
  for (int i = 0; i < dim; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5);
  EXPECT_EQ(own_p, 0.0f);  // no mass recorded for the own key either
  for (float a : pages.acc) EXPECT_EQ(a, 0.25f);
}

// tova's mass: the query's probabilities replace acc instead of adding to it (the same values
// an add from zero gives), and the own key's probability is returned as its mass.
TEST_P(DecodeTest, LastQueryMassOverwritesAcc) {
  const int dim = GetParam(), n = 9;
  const std::vector<float> k = randn(n * dim, 31), v = randn(n * dim, 32), q = randn(dim, 33);
  Pages pages(3, 4, dim);
  for (int j = 0; j < n - 1; ++j) pages.put(j + j / 4, j, &k[j * dim], &v[j * dim], 0.0f, kInf);
  const OwnKey own{&k[(n - 1) * dim], &v[(n - 1) * dim]};
  std::vector<float> out(dim);
  CachedKeys keys = pages.keys();
  const float added = decode_attention(q.data(), 0.0f, own, Penalty{}, dim, keys, out.data());
  const std::vector<float> from_zero = pages.acc;
  std::fill(pages.acc.begin(), pages.acc.end(), 0.25f);
  keys.mass.mode = cache::MassRule::Mode::kLast;
  EXPECT_EQ(decode_attention(q.data(), 0.0f, own, Penalty{}, dim, keys, out.data()), added);
  for (size_t at = 0; at < pages.acc.size(); ++at) {
    EXPECT_EQ(pages.acc[at], pages.pos[at] >= 0 ? from_zero[at] : 0.25f) << at;
  }
}

// Free slots may hold any bits (a freed key's, or NaN): the decode kernel scores 16 slots at once
// and must choose their scores away, never compute with them, nor touch their m. 24 slots a
// page: a full block of 16 and a block of 8.
TEST_P(DecodeTest, FreeSlotsHoldingNaNNeitherCountNorChange) {
  const int dim = GetParam(), n = 30, slots = 24;
  const std::vector<float> k = randn(n * dim, 41), v = randn(n * dim, 42), q = randn(dim, 43);
  const std::vector<float> lvl = randn(n, 44);
  Pages pages(2, slots, dim);
  std::fill(pages.k.begin(), pages.k.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(pages.v.begin(), pages.v.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(pages.m.begin(), pages.m.end(), 7.0f);
  const float phi = 0.1f, beta = 0.9f;
  std::vector<const float*> ks, vs;
  std::vector<double> pen;
  for (int j = 0; j < n; ++j) {
    const int at = 2 * j - j / 3;  // gaps throughout both pages
    if (j < n - 1) pages.put(at, j, &k[j * dim], &v[j * dim], lvl[j], 0.3f);
    ks.push_back(&k[j * dim]);
    vs.push_back(&v[j * dim]);
    pen.push_back(j == n - 1 ? 0.0 : beta * std::max(0.0f, lvl[j] - phi));
  }
  std::vector<float> out(dim);
  const OwnKey own{&k[(n - 1) * dim], &v[(n - 1) * dim]};
  decode_attention(q.data(), phi, own, Penalty{beta}, dim, pages.keys(), out.data());
  const std::vector<double> ref = direct(q.data(), ks, vs, pen, dim);
  for (int i = 0; i < dim; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5) << i;
  for (size_t at = 0; at < pages.pos.size(); ++at) {
    EXPECT_EQ(pages.m[at], pages.pos[at] >= 0 ? phi : 7.0f) << at;
    if (pages.pos[at] < 0) {
      EXPECT_EQ(pages.acc[at], 0.0f) << at;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, DecodeTest, ::testing::Values(8, 16, 32, 64, 128));

// The decode kernel's 16 sums at once equal 16 single sums bit for bit, so scoring 16 keys at a
// time moved no score.
// Each lane alone set, and none.
TEST(Lanes, AnyFindsEverySetLane) {
  EXPECT_FALSE(any(Ints{}));
  for (int j = 0; j < 16; ++j) {
    Ints mask{};
    mask[j] = -1;
    EXPECT_TRUE(any(mask)) << j;
  }
}

TEST(Lanes, Hsum16EqualsEachHsum) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> x = randn(16 * 16, seed, 1e3f);
    Lanes v[16];
    for (int j = 0; j < 16; ++j) v[j] = load(&x[16 * j]) * load(&x[(16 * j + 37) % 240]);
    const Lanes sums = hsum16(v);
    for (int j = 0; j < 16; ++j)
      EXPECT_EQ(std::bit_cast<uint32_t>(sums[j]), std::bit_cast<uint32_t>(hsum(v[j]))) << j;
  }
}

// The mass a chunk records under `mass`, from zero: cached keys' acc, then the chunk keys'.
std::vector<float> chunk_mass(cache::MassRule::Mode mode, int begin, int end) {
  const int dim = 8, old = 5, n = 40;  // 40 rows: two blocks of the kernel's matrix products
  const std::vector<float> k = randn(old * dim, 41), v = randn(k.size(), 42);
  const std::vector<float> q = randn(n * dim, 43), ck = randn(n * dim, 44), cv = randn(n * dim, 45);
  const std::vector<float> phi(n, 0.0f), lvl(n, 0.0f);
  Pages pages(2, 4, dim);
  for (int j = 0; j < old; ++j) pages.put(j, j, &k[j * dim], &v[j * dim], 0.0f, kInf);
  std::vector<float> out(n * dim), acc(n);
  CachedKeys keys = pages.keys();
  keys.mass = {mode, begin, end};
  const Chunk chunk{q.data(), ck.data(), cv.data(), dim, phi.data(), lvl.data(), n};
  prefill_attention(chunk, Penalty{}, dim, keys, out.data(), acc.data());
  std::vector<float> mass(pages.acc.begin(), pages.acc.begin() + old);
  mass.insert(mass.end(), acc.begin(), acc.end());
  return mass;
}

// snapkv's window: only the counted rows add, so the mass of rows [0, 40) is that of [0, 30)
// plus that of [30, 40); tova's: the last counted row's probabilities alone, as that row added
// by itself; no counted row, no mass.
TEST(PrefillMass, CountsOnlyTheRowsInRange) {
  using Mode = cache::MassRule::Mode;
  const std::vector<float> all = chunk_mass(Mode::kAdd, 0, 40);
  const std::vector<float> head = chunk_mass(Mode::kAdd, 0, 30);
  const std::vector<float> tail = chunk_mass(Mode::kAdd, 30, 40);
  double total = 0.0;
  for (size_t j = 0; j < all.size(); ++j) {
    EXPECT_NEAR(all[j], head[j] + tail[j], 1e-5) << j;
    total += tail[j];
  }
  EXPECT_NEAR(total, 10.0, 1e-4);  // ten rows hand out probability 1 each
  EXPECT_EQ(chunk_mass(Mode::kLast, 0, 34), chunk_mass(Mode::kAdd, 33, 34));
  EXPECT_EQ(chunk_mass(Mode::kLast, 0, 40), chunk_mass(Mode::kAdd, 39, 40));
  for (float x : chunk_mass(Mode::kAdd, 40, 40)) EXPECT_EQ(x, 0.0f);
}

// (eviction threshold, chunk length): +inf is a full cache, 0.5 makes the fpa rule exclude keys
// part-way through the chunk; 40 rows span two blocks of the kernel's matrix products.
class PrefillTest : public ::testing::TestWithParam<std::tuple<float, int>> {};

TEST_P(PrefillTest, ChunkMatchesTheDefinition) {
  const auto [threshold, n] = GetParam();
  const int dim = 8, old = 5, stride = 2 * dim;  // rows hold two heads; we use head 0
  const std::vector<float> k = randn((old + n) * dim, 11), v = randn(k.size(), 12);
  const std::vector<float> q = randn(n * stride, 13), ck = randn(n * stride, 14),
                           cv = randn(n * stride, 15);
  const std::vector<float> old_lvl = randn(old, 16), old_m = randn(old, 17);
  const std::vector<float> phi = randn(n, 18), lvl = randn(n, 19);
  const float beta = 0.8f;
  Pages pages(2, 4, dim);
  for (int j = 0; j < old; ++j) pages.put(j, j, &k[j * dim], &v[j * dim], old_lvl[j], old_m[j]);
  std::fill(pages.v.begin() + old * dim, pages.v.end(), NAN);  // free slots: any garbage
  std::vector<float> out(n * stride), acc(n);
  const Chunk chunk{q.data(), ck.data(), cv.data(), stride, phi.data(), lvl.data(), n};
  prefill_attention(chunk, Penalty{beta, threshold}, dim, pages.keys(), out.data(), acc.data());
  int excluded = 0;
  for (int t = 0; t < n; ++t) {
    std::vector<const float*> ks, vs;
    std::vector<double> pen;
    for (int j = 0; j < old; ++j) {
      float m = old_m[j];
      for (int u = 0; u <= t; ++u) m = std::min(m, phi[u]);
      ks.push_back(&k[j * dim]);
      vs.push_back(&v[j * dim]);
      pen.push_back(pen_of(beta, old_lvl[j] - m, threshold));
    }
    for (int j = 0; j <= t; ++j) {
      float m = kInf;
      for (int u = j + 1; u <= t; ++u) m = std::min(m, phi[u]);
      ks.push_back(&ck[j * stride]);
      vs.push_back(&cv[j * stride]);
      pen.push_back(pen_of(beta, lvl[j] - m, threshold));
    }
    excluded += std::count(pen.begin(), pen.end(), INFINITY);
    const std::vector<double> ref = direct(&q[t * stride], ks, vs, pen, dim);
    for (int i = 0; i < dim; ++i) EXPECT_NEAR(out[t * stride + i], ref[i], 1e-5) << t;
  }
  EXPECT_EQ(excluded > 0, std::isfinite(threshold));
  float min_phi = kInf;
  for (float p : phi) min_phi = std::min(min_phi, p);
  double mass = 0;
  for (int j = 0; j < old; ++j) {
    EXPECT_EQ(pages.m[j], std::min(old_m[j], min_phi));
    mass += pages.acc[j];
  }
  for (float a : acc) mass += a;
  EXPECT_NEAR(mass, n, 1e-4);  // every query hands out probability 1
}

// bf16 pages hold what float32 pages of the same (bf16-exact) values hold: prefill gives the same
// bits, decode the same bits where the kernel reads both in one order (head size 8: the generic
// kernel; 16: one vector a row) and the same to float rounding where it reads a bf16 row's 32
// elements evens first (32, 64, 128); both leave the same minima and masses.
TEST(Bf16Pages, AttendAsFloatPagesOfTheirValues) {
  for (int dim : {8, 16, 32, 64, 128}) {
    const int n = 13, stride = dim;
    const std::vector<float> k = randn(n * dim, 31), v = randn(n * dim, 32), q = randn(dim, 33);
    const std::vector<float> lvl = randn(n, 34), phi = randn(4, 35), cl = randn(4, 36);
    Pages f32(4, 4, dim);
    for (int j = 0; j < n; ++j) f32.put(j + j / 5, j, &k[j * dim], &v[j * dim], lvl[j], 0.1f * j);
    f32.round_to_bf16(false);
    Pages b16 = f32;
    b16.round_to_bf16(true);
    const OwnKey own{&k[0], &v[0]};
    const CachedKeys mass{f32.views, f32.slots, {.mode = cache::MassRule::Mode::kAdd}};
    const CachedKeys mass16{b16.views, b16.slots, {.mode = cache::MassRule::Mode::kAdd}};
    std::vector<float> a(dim), b(dim);
    const float own_a = decode_attention(q.data(), -0.2f, own, Penalty{1.3f}, dim, mass, a.data());
    const float own_b =
        decode_attention(q.data(), -0.2f, own, Penalty{1.3f}, dim, mass16, b.data());
    const float tol = dim % 32 == 0 ? 1e-6f : 0.0f;  // 0: the same bits
    EXPECT_NEAR(own_a, own_b, tol);
    for (int i = 0; i < dim; ++i) EXPECT_NEAR(a[i], b[i], tol) << "decode, dim " << dim;
    const std::vector<float> cq = randn(4 * stride, 37), ck = randn(4 * stride, 38);
    const Chunk chunk{cq.data(), ck.data(), ck.data(), stride, phi.data(), cl.data(), 4};
    std::vector<float> pa(4 * stride), pb(4 * stride), acc_a(4), acc_b(4);
    prefill_attention(chunk, Penalty{0.7f, 3.0f}, dim, mass, pa.data(), acc_a.data());
    prefill_attention(chunk, Penalty{0.7f, 3.0f}, dim, mass16, pb.data(), acc_b.data());
    EXPECT_EQ(pa, pb) << "prefill, dim " << dim;
    EXPECT_EQ(acc_a, acc_b);
    EXPECT_EQ(f32.m, b16.m);
    for (size_t j = 0; j < f32.acc.size(); ++j) EXPECT_NEAR(f32.acc[j], b16.acc[j], tol);
  }
}

TEST(ThreadPool, RunsEveryIndexOnceAcrossManyRuns) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(97);
  for (int run = 0; run < 200; ++run) {
    pool.run(97, [&](int i) { hits[i].fetch_add(1); });
  }
  for (const auto& h : hits) EXPECT_EQ(h.load(), 200);
  pool.run(0, [&](int) { ADD_FAILURE(); });
}

// Every block of 64 outputs in exactly one range, whatever the row count and schedule: equal
// ranges, a few a thread; guided ones shrinking to single blocks at the end.
TEST(ThreadPool, OutputBlocksCoverEveryBlockOnce) {
  ThreadPool pool(2);
  for (const int rows : {1, 64, 65, 1030, 5632}) {
    for (const bool guided : {false, true}) {
      const int blocks = (rows + 63) / 64;
      std::mutex mu;
      std::vector<std::pair<int, int>> ranges;
      std::vector<int> hits(blocks, 0);
      for_output_blocks(
          &pool, rows, 1L << 20,
          [&](int b0, int b1) {
            const std::lock_guard lock(mu);
            ranges.emplace_back(b0, b1);
            for (int b = b0; b < b1; ++b) ++hits[b];
          },
          guided);
      for (const int h : hits) EXPECT_EQ(h, 1) << rows << " " << guided;
      std::sort(ranges.begin(), ranges.end());
      std::vector<int> size;
      for (const auto& [b0, b1] : ranges) size.push_back(b1 - b0);
      if (guided) {  // longest first, one block last
        EXPECT_TRUE(std::is_sorted(size.rbegin(), size.rend())) << rows;
        EXPECT_EQ(size.back(), 1) << rows;
      } else {  // min(blocks, 4 a thread), within a block of each other
        EXPECT_EQ(static_cast<int>(size.size()), std::min(blocks, 8)) << rows;
        EXPECT_LE(*std::max_element(size.begin(), size.end()) -
                      *std::min_element(size.begin(), size.end()),
                  1)
            << rows;
      }
    }
  }
}

// Told the range its thread takes next (int8_linear fetches that range's first block ahead): one
// thread's ranges, in its order, are a chain of next links ending in -1, and every block is in
// one range, whether the loop runs on the pool or on the calling thread.
TEST(ThreadPool, OutputBlocksTellEachThreadItsNextRange) {
  for (const int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (const int rows : {64, 1030, 5632}) {
      for (const bool guided : {false, true}) {
        std::mutex mu;
        std::map<std::thread::id, std::vector<std::array<int, 3>>> calls;  // (b0, b1, next)
        for_output_blocks(
            &pool, rows, 1L << 20,
            [&](int b0, int b1, int next) {
              const std::lock_guard lock(mu);
              calls[std::this_thread::get_id()].push_back({b0, b1, next});
            },
            guided);
        std::vector<int> hits((rows + 63) / 64, 0);
        for (const auto& [thread, seq] : calls) {
          for (size_t k = 0; k < seq.size(); ++k) {
            for (int b = seq[k][0]; b < seq[k][1]; ++b) ++hits[b];
            EXPECT_EQ(seq[k][2], k + 1 < seq.size() ? seq[k + 1][0] : -1) << rows << " " << guided;
          }
        }
        for (const int h : hits) EXPECT_EQ(h, 1) << rows << " " << guided;
      }
    }
  }
}

// A batch's token rows go to both threads however few they are (a batch of 32 tokens' norms ran
// on one thread), each row once.
TEST(ThreadPool, TokenRowsCoverEveryRowOnceOnBothThreads) {
  ThreadPool pool(2);
  for (const int n : {1, 2, 7, 32, 512}) {
    std::mutex mu;
    std::vector<int> hits(n, 0);
    int calls = 0;
    for_token_rows(&pool, n, 1L << 20, [&](int r0, int rows) {
      const std::lock_guard lock(mu);
      ++calls;
      for (int r = r0; r < r0 + rows; ++r) ++hits[r];
    });
    for (const int h : hits) EXPECT_EQ(h, 1) << n;
    EXPECT_EQ(calls, std::min(n, 8)) << n;
  }
}

// Each index once, and each thread's `next` the index it then runs: the indices one thread ran,
// in its order, are a chain of next links ending in -1.
TEST(ThreadPool, RunAheadTellsEachThreadItsNextIndex) {
  for (const int threads : {1, 2, 3}) {
    const ThreadPool pool(threads);
    for (int run = 0; run < 50; ++run) {
      std::mutex mu;
      std::map<std::thread::id, std::vector<std::pair<int, int>>> calls;  // thread -> (i, next)
      pool.run_ahead(97, [&](int i, int next) {
        const std::lock_guard lock(mu);
        calls[std::this_thread::get_id()].emplace_back(i, next);
      });
      std::vector<int> hits(97, 0);
      for (const auto& [thread, seq] : calls) {
        for (size_t k = 0; k < seq.size(); ++k) {
          ++hits[seq[k].first];
          EXPECT_EQ(seq[k].second, k + 1 < seq.size() ? seq[k + 1].first : -1);
        }
      }
      for (const int h : hits) EXPECT_EQ(h, 1);
    }
  }
  ThreadPool(2).run_ahead(0, [](int, int) { ADD_FAILURE(); });
}

INSTANTIATE_TEST_SUITE_P(ThresholdsAndLengths, PrefillTest,
                         ::testing::Combine(::testing::Values(INFINITY, 0.5f),
                                            ::testing::Values(6, 40)));

}  // namespace
}  // namespace fpa::cpu
