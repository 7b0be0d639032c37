// Iteration-level continuous batching over one ModelRunner (which is not thread-safe: only the
// scheduler thread touches it). Each iteration admits waiting requests into the running batch,
// gives prefilling requests their next prompt chunk (up to --prefill-chunk tokens in all), runs
// one decode token for every other running request in the same step, samples, streams the tokens
// out, and frees the pages of requests that finished, were cancelled or ran past their deadline.
//
// Backpressure: a full queue refuses a request with RESOURCE_EXHAUSTED. When the cache cannot
// take a step, prefill chunks wait for decoding requests to free pages; when even the decode
// step does not fit, the youngest request fails with RESOURCE_EXHAUSTED (no preemption).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/model_runner.h"
#include "server/metrics.h"
#include "server/request.h"

namespace fpa::server {

struct SchedulerOptions {
  int max_batch = 32;
  int max_queue = 256;
  int prefill_chunk = 256;
};

class Scheduler {
 public:
  Scheduler(ModelRunner& runner, SchedulerOptions options, ServerMetrics* metrics);
  ~Scheduler();  // drains with no grace period when drain() was not called

  void start();
  // Queues a request; ResourceExhausted when the queue is full, Unavailable when draining.
  // On success the request's sink will get on_finish exactly once.
  absl::Status submit(std::shared_ptr<Request> request);
  // Stops taking requests and lets the queued and running ones finish for at most `grace`; then
  // fails what is left with UNAVAILABLE and stops the thread.
  void drain(std::chrono::duration<double> grace);

  int running() const { return n_running_.load(); }
  int waiting() const { return n_waiting_.load(); }

 private:
  struct Active;
  struct Intake;

  Intake take_work();
  void loop();
  void admit(std::vector<std::shared_ptr<Request>> admitted);
  void reap();
  void iterate();
  void emit(Active& a, int32_t token, float logprob);
  void complete(Active& a, absl::Status status);
  void fail_waiting(std::shared_ptr<Request> request, const absl::Status& status);

  ModelRunner& runner_;
  const SchedulerOptions options_;
  ServerMetrics* metrics_;

  std::mutex mu_;
  std::condition_variable wake_;  // work arrived, or drain/abort
  std::condition_variable done_;  // the loop has exited
  std::deque<std::shared_ptr<Request>> waiting_;
  bool accepting_ = true;
  bool stopping_ = false;  // exit once idle
  bool aborting_ = false;  // exit now, failing everything
  bool exited_ = false;

  std::vector<std::unique_ptr<Active>> running_;  // scheduler thread only, admission order
  std::vector<float> logits_;
  std::atomic<int> n_running_{0};
  std::atomic<int> n_waiting_{0};
  std::thread thread_;
};

}  // namespace fpa::server
