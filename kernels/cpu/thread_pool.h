// The CPU backend's parallel loops, on OpenMP's threads: oneDNN (the bf16 projections) runs on
// the same OpenMP team, so the two never spin against each other for the cores. Indices are
// claimed one at a time, so a thread the OS has not scheduled yet gets fewer of them; the team
// still meets at the loop's end. Idle threads spin for a while (libgomp's default), which a
// decode step's 60-odd loops a few microseconds apart need, then sleep.
#pragma once

#include <functional>

namespace fpa::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(threads) {}

  int threads() const { return threads_; }
  // Calls f(i) for every i in [0, n) and returns when all calls have returned.
  void run(int n, const std::function<void(int)>& f) const;
  // As run, calling f(i, next) where next is the index the same thread calls next (-1: none): a
  // thread claims its next index before it runs the current one, so it can fetch that one's data
  // while it ends this one. The team still meets within two indices of each other.
  void run_ahead(int n, const std::function<void(int, int)>& f) const;

 private:
  int threads_;
};

}  // namespace fpa::cpu
