// The step planner: which running requests step next and with how many tokens, and, when the
// pool cannot hold them all, which cached prefixes are dropped and who gives way. A pure
// function of the pool's state as the cache reports it: it decides, the scheduler applies its
// decisions (reclaims, preemptions, failures, reservations) in that order. Also the admission
// rule and the recompute mode, the other page arithmetic of memory policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace fpa::cache {

// One running request as the planner sees it, the list in order of first admission.
struct PlanEntry {
  bool prefilling = false;  // its next step is a prompt (or recompute) chunk, which may shrink
  int64_t tokens = 0;       // that step's tokens
  int preemptions = 0;
  int64_t held_pages = 0;  // what preempting it gives back
  // The worst case of pages appending n tokens to its sequence may take (KvCache::pages_needed).
  std::function<int64_t(int64_t n)> pages_needed;
};

struct PoolState {
  int64_t free_pages = 0;
  std::vector<int64_t> snapshot_pages;  // reclaimable snapshots, least recently used first
};

struct StepPlan {
  struct Item {
    size_t entry = 0;
    int64_t tokens = 0;
  };
  std::vector<Item> items;         // the step: decode tokens first, then prompt chunks
  std::vector<size_t> preempted;   // give way, in that order
  std::vector<size_t> failed;      // do not fit the pool even alone
  size_t snapshots_reclaimed = 0;  // the least recently used ones go
};

// A preempted request gives way at most this many times before others pay instead, or wait; only a
// step in which nothing could run otherwise preempts one more time.
inline constexpr int kMaxPreemptions = 3;

// One decode token for every request past its prompt first (a decoder is the costly one to
// recompute), then prompt chunks first come first served within `prefill_budget` tokens. A step
// that does not fit takes, in turn: cached prefixes; a prompt chunk's shrinking to what fits; a
// victim's preemption (see step_planner.cc); and alone, the request's failure.
StepPlan plan_step(const PoolState& pool, std::span<const PlanEntry> entries,
                   int64_t prefill_budget);

// A waiting request's admission beside the running ones.
struct Admission {
  int64_t ahead_pages = 0;       // what its next step (under none: its whole rest) may take
  int64_t high_water_pages = 0;  // most pages it held when preempted (0: never)
  int64_t streams = 0;           // layers * heads: one new page each for its next token
  int64_t running_ahead = 0;     // what the running requests may take likewise
  int64_t watermark = 0;         // pages admission leaves free for them to grow into
  int64_t free_pages = 0;
  int64_t reclaimable_pages = 0;  // cached prefixes
};
// Whether it fits. A preempted request must fit with what it held and its next token in every
// stream: else it regrows into the same shortage and is preempted again (thrash).
bool admits(const Admission& a);

// The tokens of a request's next step: a chunk of what it must (re)compute up to the next
// multiple of `chunk` (the boundaries of a solo run), or 1 once decoding. Generated tokens
// recomputed after a preemption go in as chunks only when `chunks_replay_decode` (the policy's
// kernels exclude every evicted key); else one at a time, as decode fed them.
int64_t next_step_tokens(int64_t prompt, int64_t target, int64_t cached, int64_t chunk,
                         bool chunks_replay_decode);

}  // namespace fpa::cache
