// Iteration-level continuous batching over one ModelRunner (which is not thread-safe: only the
// scheduler thread touches it). Memory is the KV manager's (cache/kv_manager.h), the scheduler's
// one door to it: admission (whether a request fits, its sequence from a cached prefix), each
// step (planned by cache::plan_step from the pool's state: who steps with how many tokens, which
// cached prefixes go and who is preempted; then reserved) and each request's end. A preempted
// request's pages go back to the pool and it returns to the head of the queue with what it
// generated; on readmission its prompt and output are recomputed (cache::next_step_tokens: by
// chunks, or its output one token at a time where chunks would not replay decode) and it goes
// on, its sampler untouched, so the client sees one unbroken stream.
//
// Refusals: a full queue (RESOURCE_EXHAUSTED at submission); a request that cannot fit even alone
// in the empty pool (RESOURCE_EXHAUSTED, at submission when that is known up front).
//
// With the prefix cache on, a request starts from the longest cached prefix of its prompt (or,
// resumed after a preemption, of its prompt and output; under the heuristics, only the state of
// exactly its prompt, on a resume), its prompt's state is offered to the cache once its first
// token is out, its finished sequence becomes the cached final state, and cached prefixes are
// reclaimed before anything running is preempted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cache/kv_manager.h"
#include "server/engine/model_runner.h"
#include "server/metrics/metrics.h"
#include "server/request/request.h"

namespace fpa::server {

struct SchedulerOptions {
  int max_batch = 32;
  int max_queue = 256;
  int prefill_chunk = 256;
  // Share of the pool admission leaves free, so running requests can grow before preempting.
  double watermark = 0.01;
  std::string pool_flag = "--cache-bytes";  // the flag that sized the pool, for error messages
  // Share of the pool cached prefixes may hold (cache/prefix_cache.h); 0 turns them off.
  double prefix_cache_share = 0.0;
};

class Scheduler {
 public:
  Scheduler(ModelRunner& runner, SchedulerOptions options, ServerMetrics* metrics);
  ~Scheduler();  // drains with no grace period when drain() was not called

  void start();
  // Queues a request; ResourceExhausted when the queue is full or the request cannot fit the
  // pool even alone, Unavailable when draining. On success the request's sink will get
  // on_finish exactly once.
  absl::Status submit(std::shared_ptr<Request> request);
  // Stops taking requests and lets the queued and running ones finish for at most `grace`; then
  // fails what is left with UNAVAILABLE and stops the thread.
  void drain(std::chrono::duration<double> grace);

  int running() const { return n_running_.load(); }
  int waiting() const { return n_waiting_.load(); }
  // Null when the prefix cache is off; its stats() may be read from any thread.
  const cache::PrefixCache* prefix_cache() const { return kv_.prefix_cache(); }

 private:
  struct Active;
  struct Intake;
  struct Plan;

  Intake take_work();
  void loop();
  void admit();
  absl::Status start_sequence(Active& a);
  void reap();
  void iterate();
  Plan plan_step();
  void preempted(Active& a);
  void record_step(const Plan& plan);
  void score_prompt(Active& a, size_t from, std::span<const float> rows);
  bool send_prompt_scores(Active& a);
  void emit(Active& a, int32_t token, Scored scored);
  void complete(Active& a, absl::Status status);
  FinishedRequest finished(const Active& a) const;

  ModelRunner& runner_;
  const SchedulerOptions options_;
  ServerMetrics* metrics_;
  cache::KvManager kv_;  // scheduler thread only, but for its stats

  std::mutex mu_;
  std::condition_variable wake_;  // work arrived, or drain/abort
  std::condition_variable done_;  // the loop has exited
  // New requests at the back, preempted ones back at the front.
  std::deque<std::unique_ptr<Active>> waiting_;
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
