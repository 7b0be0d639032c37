#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace fpa::cpu {

void ThreadPool::run(int n, const std::function<void(int)>& f) const {
  if (threads_ <= 1 || n <= 1) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int> next{0};
#pragma omp parallel num_threads(std::min(threads_, n))
  for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
}

void ThreadPool::run_ahead(int n, const std::function<void(int, int)>& f) const {
  if (threads_ <= 1 || n <= 1) {
    for (int i = 0; i < n; ++i) f(i, i + 1 < n ? i + 1 : -1);
    return;
  }
  std::atomic<int> next{0};
#pragma omp parallel num_threads(std::min(threads_, n))
  for (int i = next.fetch_add(1); i < n;) {
    const int after = next.fetch_add(1);
    f(i, after < n ? after : -1);
    i = after;
  }
}

}  // namespace fpa::cpu
