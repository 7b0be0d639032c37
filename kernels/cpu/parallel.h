// When the CPU backend's loops go parallel. BLAS runs single-threaded inside the pool's loops,
// so the two never compete for the cores.
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace fpa::cpu {

// Multiply-adds below which a loop stays on the calling thread: waking the others costs more.
inline constexpr long kMinParallelWork = 1L << 16;

// Calls f(i) for i in [0, n): on the pool when `work` multiply-adds make it worth it.
template <class F>
void parallel_for(ThreadPool* pool, int n, long work, const F& f) {
  if (pool == nullptr || pool->threads() <= 1 || work < kMinParallelWork) {
    for (int i = 0; i < n; ++i) f(i);
  } else {
    pool->run(n, f);
  }
}

// Calls f(r0, rows) for blocks of a matrix product's `out_rows` output rows: a multiple of 16
// wide, a few per thread so that a fast thread can take over a slow one's share.
template <class F>
void for_row_blocks(ThreadPool* pool, int out_rows, long work, const F& f) {
  const int threads = pool != nullptr ? pool->threads() : 1;
  const int blocks = std::max(1, std::min(threads * 4, out_rows / 64));
  const int width = ((out_rows + blocks - 1) / blocks + 15) / 16 * 16;
  parallel_for(pool, blocks, work, [&](int b) {
    const int r0 = b * width;
    const int rows = std::min(width, out_rows - r0);
    if (rows > 0) f(r0, rows);
  });
}

// Calls f(b0, b1) for ranges of the blocks of 64 outputs of an `out_rows`-row product (the
// packed layouts of bf16_linear and int8_linear), a few ranges per thread so that a fast thread
// can take over a slow one's share.
template <class F>
void for_output_blocks(ThreadPool* pool, int out_rows, long work, const F& f) {
  const int blocks = (out_rows + 63) / 64;
  const int threads = pool != nullptr ? pool->threads() : 1;
  const int parts = std::min(blocks, threads * 4);
  parallel_for(pool, parts, work, [&](int i) { f(blocks * i / parts, blocks * (i + 1) / parts); });
}

// Calls f(i0, i1) for ranges of [0, n) of about equal work (cost(i) multiply-adds each), a few
// per thread so that a fast thread can take over a slow one's share; a range's indices run in
// order on one thread, which can so fetch the next one's data ahead of time.
template <class C, class F>
void for_ranges(ThreadPool* pool, int n, const C& cost, const F& f) {
  if (n <= 0) return;
  std::vector<long> sum(static_cast<size_t>(n) + 1, 0);  // prefix sums of the costs
  for (int i = 0; i < n; ++i) sum[i + 1] = sum[i] + cost(i);
  const int threads = pool != nullptr ? pool->threads() : 1;
  const int parts = std::max(1, std::min(n, threads * 4));
  std::vector<int> cut{0};  // range k is [cut[k], cut[k + 1])
  for (int k = 1; k < parts; ++k) {
    const long target = sum[n] * k / parts;
    const int at = static_cast<int>(std::lower_bound(sum.begin(), sum.end(), target) - sum.begin());
    if (at > cut.back() && at < n) cut.push_back(at);
  }
  cut.push_back(n);
  parallel_for(pool, static_cast<int>(cut.size()) - 1, sum[n],
               [&](int k) { f(cut[k], cut[k + 1]); });
}

// Makes OpenBLAS run in its caller's thread; call once per process.
void use_single_threaded_blas();

}  // namespace fpa::cpu
