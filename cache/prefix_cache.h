// The compressed prefix cache: the state of a sequence after a token prefix, kept for the next
// request that starts with it (a conversation's next turn, a shared system prompt). The state of
// an FPA sequence after a prefix is fully determined by the prefix and small: its live keys with
// their levels and minima, and each stream's last field value. A snapshot is a sequence that
// never runs: a finished request's own sequence (adopt: no copy), or a fork of a running one
// (offer); a hit forks it into the new request's sequence.
// Copying rather than sharing pages: a key's running minimum m (and h2o's mass) keeps changing in
// every sequence that goes on from the prefix, so shared pages would need copy-on-write of m on
// every step; a copy costs one pass over the live keys, which FPA keeps few. With copies no
// snapshot is ever in use, so reference counts are not needed: eviction is least recently used.
//
// Snapshots are indexed by a radix tree over token ids (as SGLang's RadixAttention), one tree
// per policy configuration, so a prefix cached under one policy or tau never serves another.
// Not thread-safe: the scheduler thread owns it; stats() and held() may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "cache/kv_cache.h"

namespace fpa::cache {

struct PrefixCacheStats {
  int64_t snapshots = 0;
  int64_t pages = 0;
  int64_t queried_tokens = 0;  // prompt tokens looked up
  int64_t hit_tokens = 0;      // of those, found cached
  int64_t evictions = 0;       // snapshots dropped for room
  int64_t trees = 0;           // policy configurations holding a snapshot
  int64_t full_keys = 0;       // the snapshots' full-cache keys (length * layers * heads)
  int64_t live_keys = 0;       // the snapshots' live keys
};

// The pool's figures split between what the running sequences hold and the snapshots. Snapshots
// never run and are reclaimable, so they count as cache, not as use, as vLLM counts its cached
// blocks.
struct HeldStats {
  CacheStats running;
  PrefixCacheStats cached;
};

class PrefixCache;
// Thread-safe. `prefixes` may be null (no prefix cache): then all of the pool runs.
HeldStats held_stats(const KvCache& pool, const PrefixCache* prefixes);

class PrefixCache {
 public:
  // Snapshots may hold at most max_pages pages of the pool.
  PrefixCache(KvCache& cache, int64_t max_pages);
  ~PrefixCache();  // flushes
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Hit {
    SeqId seq = -1;      // a new sequence in the cached state
    int64_t tokens = 0;  // the prefix it holds
  };
  // How a lookup matches: the longest cached prefix, or the state of exactly the tokens given
  // (where a state depends on the chunks that built it, only its own run may take it).
  enum class Match { kLongestPrefix, kWhole };
  // The cached state of `tokens` under `policy` (per `match`): a new sequence forked from it. A
  // miss (or a hit that cannot be copied now) is nullopt. With `count`, `tokens` count as queried
  // (and the hit as hit); a preempted request's readmission looks up again uncounted.
  std::optional<Hit> take(std::span<const int32_t> tokens, const PolicyConfig& policy,
                          bool count = true, Match match = Match::kLongestPrefix);
  // Offers the state of `seq`, which holds exactly `tokens`, to the cache: copied unless that
  // prefix is cached already, after dropping least recently used snapshots to stay within the
  // share; skipped when it cannot fit. True when the state is cached afterwards.
  bool offer(SeqId seq, std::span<const int32_t> tokens, const PolicyConfig& policy);
  // As offer, for a sequence that will not run again: it becomes the snapshot itself (no copy,
  // no extra pages), or is released when that prefix is cached already or cannot fit the share.
  // Either way the cache owns `seq` afterwards.
  bool adopt(SeqId seq, std::span<const int32_t> tokens, const PolicyConfig& policy);
  // Drops the snapshot of exactly `tokens`, if any (a longer state superseded it).
  void forget(std::span<const int32_t> tokens, const PolicyConfig& policy);
  // Drops the least recently used snapshot; false when there is none. The planner calls it
  // before it preempts a running request: cached prefixes are reclaimable memory.
  bool reclaim_one();
  // The pages each reclaim_one would free in turn: every snapshot, least recently used first.
  std::vector<int64_t> reclaimable_pages() const;
  void flush();  // drops every snapshot

  PrefixCacheStats stats() const;
  // The pool's figures and the snapshots' read at one moment (held_stats for a caller).
  HeldStats held() const;

 private:
  struct Node;
  Node* find(std::span<const int32_t> tokens, const PolicyConfig& policy, bool exact);
  Node* insert(std::span<const int32_t> tokens, const PolicyConfig& policy);
  // offer and adopt: `make` turns `seq` into the snapshot (a fork, or `seq` itself).
  bool place(SeqId seq, std::span<const int32_t> tokens, const PolicyConfig& policy, int64_t need,
             absl::FunctionRef<absl::StatusOr<SeqId>(SeqId)> make);
  void touch(Node* node);  // most recently used now
  void drop(Node* node);

  KvCache& cache_;
  const int64_t max_pages_;
  std::map<std::string, std::unique_ptr<Node>> roots_;  // by policy configuration
  std::map<uint64_t, Node*> lru_;                       // last use -> node with a snapshot
  uint64_t clock_ = 0;
  // Held while a snapshot joins or leaves the pool and its figures, and while held() reads both:
  // otherwise a reader between the two counts a new snapshot as a running sequence, or a dropped
  // one twice.
  mutable std::mutex held_mu_;
  std::atomic<int64_t> snapshots_{0}, pages_{0}, queried_{0}, hits_{0}, evictions_{0}, trees_{0},
      full_keys_{0}, live_keys_{0};
};

}  // namespace fpa::cache
