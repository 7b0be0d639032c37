#include "kernels/cpu/thread_pool.h"

namespace fpa::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Claims and runs indices of run `generation` (f over [0, n)) until none are left.
void ThreadPool::work(uint64_t generation, const std::function<void(int)>& f, int n) {
  uint64_t cur = next_.load(std::memory_order_acquire);
  while ((cur >> 32) == (generation & 0xffffffffu) && static_cast<int>(cur & 0xffffffffu) < n) {
    if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
    f(static_cast<int>(cur & 0xffffffffu));
    done_.fetch_add(1, std::memory_order_release);
    cur = next_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t generation;
    const std::function<void(int)>* job;
    int n;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation = generation_;
      job = job_;
      n = n_;
    }
    work(generation, *job, n);
  }
}

void ThreadPool::run(int n, const std::function<void(int)>& f) {
  if (workers_.empty() || n <= 1) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
  uint64_t generation;
  {
    std::lock_guard lock(mu_);
    generation = ++generation_;
    job_ = &f;
    n_ = n;
    done_.store(0, std::memory_order_relaxed);
    next_.store((generation & 0xffffffffu) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  work(generation, f, n);
  while (done_.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

}  // namespace fpa::cpu
