// The KV manager: the scheduler's one door to memory (as vLLM's KVCacheManager and SGLang's tree
// cache). It owns every decision about what a request's keys may take and what stays cached:
//  - admission: whether a request fits (exact under `none`, whose need is known; the next step
//    otherwise), and its sequence, started from the longest cached prefix that serves it;
//  - the step: cache::plan_step on the pool's state, its decisions applied (cached prefixes
//    reclaimed, victims' and failed requests' pages released, the planned items' pages
//    reserved), so the step cannot run out midway;
//  - the end: a finished request's sequence BECOMES the cached snapshot of what it holds (no
//    copy, no extra pages), superseding its prompt's; preempted and failed ones give their pages
//    back.
// The page arithmetic and the prefix cache's offer / forget / reclaim live here and nowhere else;
// the invariant that no snapshot is dropped while the branch it would prune is being filled is
// PrefixCache's, which only this class drives. Not thread-safe: the scheduler thread owns it;
// stats() and prefix_cache()->stats() may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "cache/step_planner.h"

namespace fpa::cache {

struct KvManagerOptions {
  // Share of the pool admission leaves free, so running requests can grow before preempting.
  double watermark = 0.01;
  // Share of the pool cached prefixes may hold; 0 turns the prefix cache off.
  double prefix_cache_share = 0.0;
  std::string pool_flag = "--cache-bytes";  // the flag that sized the pool, for error messages
};

// The memory side of one request, owned by its scheduler entry and kept across preemptions.
struct KvRequest {
  PolicyConfig policy;  // prompt_tokens set to the prompt's length
  int64_t prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  bool replay_chunks = true;     // chunks_replay_decode(policy), fixed at construction
  int64_t next_tokens = 1;       // its next step's tokens, kept current by the scheduler
  SeqId seq = -1;                // its sequence while admitted
  int64_t high_water_pages = 0;  // most pages its sequence held when it was preempted

  KvRequest(const PolicyConfig& policy, int64_t prompt_tokens, int64_t max_new_tokens);
};

// How a request enters: what it must have cached before its next decode step.
struct AdmitQuery {
  std::span<const int32_t> context;  // the prompt, then every token generated so far
  bool resume = false;               // preempted after generating (context holds output)
  bool scoring = false;              // its prompt is scored: every row's logits, no cached prefix
  bool count = true;                 // a client's lookup (a readmission's is not counted)
};

// One running request's next step as the scheduler asks for it.
struct StepAsk {
  KvRequest* request = nullptr;
  bool prefilling = false;
  int64_t tokens = 0;
  int preemptions = 0;
};

// The step as decided and applied: entries index the asks. Preempted and failed requests hold
// no sequence any more; `broken` were planned but their reservation failed (a bug in the plan's
// arithmetic), so they hold their sequence and must not step.
struct ReservedStep {
  StepPlan plan;
  std::vector<size_t> broken;
};

class KvManager {
 public:
  KvManager(KvCache& cache, KvManagerOptions options);
  ~KvManager();  // drops every snapshot
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  // Known at submission under `none`, whose need is exact: the whole sequence must fit the
  // empty pool (ResourceExhausted otherwise). Under the other policies eviction decides.
  absl::Status check_fits_alone(const KvRequest& r) const;
  // Whether `r` fits beside what the running requests may still take and the watermark
  // (cache::admits, which holds a preempted request back until what it held fits again).
  bool can_admit(const KvRequest& r) const;
  // Starts r's sequence from the longest cached prefix that serves it (strictly shorter than a
  // fresh prompt, whose last token's logits are needed; where chunks do not replay decode, only
  // the state of exactly its prompt, on a resume), else empty. Returns the tokens it holds.
  absl::StatusOr<int64_t> admit(KvRequest& r, const AdmitQuery& q);
  // Offers the state of r's running sequence, which holds exactly `tokens`, as a copy (the
  // sequence goes on). True when cached.
  bool offer(const KvRequest& r, std::span<const int32_t> tokens);
  // Plans the step over the running requests (in order of first admission) and applies it.
  ReservedStep reserve_step(std::span<const StepAsk> asks, int64_t prefill_budget);
  // A preempted request gives its pages back and keeps its high-water mark for readmission.
  void preempt(KvRequest& r);
  // The request ends holding exactly `tokens`. When `cache_state` (it succeeded) and its policy's
  // state can serve a later run, its sequence becomes the snapshot of `tokens` and its prompt's
  // snapshot is forgotten; else its pages go back to the pool.
  void finish(KvRequest& r, std::span<const int32_t> tokens, bool cache_state);

  int64_t reclaimable_pages() const;
  // Null when the prefix cache is off; its stats() may be read from any thread.
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  const KvCache& cache() const { return cache_; }
  SequenceStats sequence_stats(const KvRequest& r) const;
  void flush();  // drops every snapshot (the scheduler's exit)

 private:
  int64_t pages_for_new(int64_t tokens) const;
  int64_t pages_ahead(const KvRequest& r) const;
  void release(KvRequest& r);

  KvCache& cache_;
  const KvManagerOptions options_;
  std::unique_ptr<PrefixCache> prefix_;
  std::vector<const KvRequest*> running_;  // admitted and holding a sequence
};

}  // namespace fpa::cache
