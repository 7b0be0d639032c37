// The CPU backend's one threading runtime: OpenMP loops. BLAS runs single-threaded inside them,
// so the two never compete for the cores.
#pragma once

namespace fpa::cpu {

// Multiply-adds below which a loop stays on one thread: waking the others costs more, and far
// more on a busy machine where a descheduled thread stalls the whole barrier.
inline constexpr long kMinParallelWork = 1L << 20;

inline int threads_for(long work, int threads) { return work >= kMinParallelWork ? threads : 1; }

// Calls f(i) for i in [0, n) on up to `threads` threads (in the caller when threads <= 1).
template <class F>
void parallel_for(int n, int threads, const F& f) {
  if (threads <= 1 || n <= 1) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int i = 0; i < n; ++i) f(i);
}

// Makes OpenBLAS run in its caller's thread (see parallel_for); call once per process.
void use_single_threaded_blas();

}  // namespace fpa::cpu
