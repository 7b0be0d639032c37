// When the CPU backend's loops go parallel. BLAS runs single-threaded inside the pool's loops,
// so the two never compete for the cores.
#pragma once

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

// Makes OpenBLAS run in its caller's thread; call once per process.
void use_single_threaded_blas();

}  // namespace fpa::cpu
