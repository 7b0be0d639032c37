// When the CPU backend's loops go parallel. BLAS runs single-threaded inside the pool's loops,
// so the two never compete for the cores.
#pragma once

#include <algorithm>
#include <type_traits>

#include "absl/container/inlined_vector.h"
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

// Calls f(r0, rows) for blocks of `n` rows that each hold one token's vector (norms, RoPE, an
// activation's quantization): any split is as good, a few blocks per thread. for_row_blocks'
// 64-row minimum kept a batch of 32 tokens' norms on one thread while the other waited.
template <class F>
void for_token_rows(ThreadPool* pool, int n, long work, const F& f) {
  const int threads = pool != nullptr ? pool->threads() : 1;
  const int blocks = std::max(1, std::min(threads * 4, n));
  parallel_for(pool, blocks, work, [&](int b) {
    const int r0 = n * b / blocks, r1 = n * (b + 1) / blocks;
    if (r1 > r0) f(r0, r1 - r0);
  });
}

// Calls f(i, next) for i in [0, n) as parallel_for calls f(i), next being the index the same
// thread calls next (-1: none), so that it can fetch that one's data ahead of time.
template <class F>
void parallel_for_ahead(ThreadPool* pool, int n, long work, const F& f) {
  if (pool == nullptr || pool->threads() <= 1 || work < kMinParallelWork) {
    for (int i = 0; i < n; ++i) f(i, i + 1 < n ? i + 1 : -1);
  } else {
    pool->run_ahead(n, f);
  }
}

// Calls f(b0, b1) for ranges of the blocks of 64 outputs of an `out_rows`-row product (the
// packed layouts of bf16_linear and int8_linear), so that a fast thread can take over a slow one's
// share: a few equal ranges per thread, or where `guided`, ranges that shrink as they go, each a
// share of the blocks left (OpenMP's guided schedule), long streams first and the last ranges a
// block or two, so the threads end close together. An f of three arguments is called
// f(b0, b1, next), next being the first block of the range its thread takes next (-1: none): a
// kernel that fetches its next block while it works on this one (int8_linear's passes over 7 or
// more tokens) then fetches across ranges too, where it lost a block's worth at each one's start.
template <class F>
void for_output_blocks(ThreadPool* pool, int out_rows, long work, const F& f, bool guided = false) {
  const int blocks = (out_rows + 63) / 64;
  const int threads = pool != nullptr ? pool->threads() : 1;
  const int parts = std::min(blocks, threads * 4);
  // A decode step calls this about a hundred times: its few ranges stay off the heap.
  absl::InlinedVector<int, 64> start{0};
  while (start.back() < blocks) {
    const int i = static_cast<int>(start.size());
    start.push_back(guided ? start.back() + std::max(1, (blocks - start.back()) / (2 * threads))
                           : blocks * i / parts);
  }
  const int ranges = static_cast<int>(start.size()) - 1;
  if constexpr (std::is_invocable_v<const F&, int, int, int>) {
    parallel_for_ahead(pool, ranges, work, [&](int i, int next) {
      f(start[i], start[i + 1], next < 0 ? -1 : start[next]);
    });
  } else {
    parallel_for(pool, ranges, work, [&](int i) { f(start[i], start[i + 1]); });
  }
}

// Makes OpenBLAS run in its caller's thread; call once per process.
void use_single_threaded_blas();

}  // namespace fpa::cpu
