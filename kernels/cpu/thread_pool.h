// A small pool for the CPU backend's parallel loops. The calling thread works too and waits only
// for items already started: a worker the OS has not scheduled yet simply gets nothing, so a
// busy machine slows a loop down instead of stalling it at a barrier (as an OpenMP team does).
// Idle workers sleep on a condition variable; nothing spins between loops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fpa::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads - 1 workers besides the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls f(i) for every i in [0, n) and returns when all calls have returned. One caller at a
  // time (the backend's forward is serialised).
  void run(int n, const std::function<void(int)>& f);

 private:
  void work(uint64_t generation, const std::function<void(int)>& f, int n);
  void worker_loop();

  std::mutex mu_;
  std::condition_variable wake_;
  uint64_t generation_ = 0;  // guarded by mu_; bumped per run
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;  // guarded by mu_
  int n_ = 0;                                      // guarded by mu_
  // generation << 32 | next index: a worker still busy with an old run can never claim an index
  // of a new one.
  std::atomic<uint64_t> next_{0};
  std::atomic<int> done_{0};
  std::vector<std::thread> workers_;
};

}  // namespace fpa::cpu
