// The paged KV cache with per-head eviction (docs/fpa.md sections 2 and 3).
//
// A fixed pool of pages. Each stream -- one (sequence, layer, head) -- owns a list of pages of
// `page_slots` slots; a slot holds one key of that head: k, v, level, running minimum m, the
// attention mass it has received (for the policies that rank by it) and its token position.
// The cache does the bookkeeping (which slot is live, who dies when); backends read and write
// slot contents through PageView (host storage) or mirror them in device memory by page id.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/device_pool.h"

namespace fpa::cache {

using SeqId = int64_t;

struct CacheShape {
  int n_layers = 0;
  int n_heads = 0;
  int head_dim = 0;
  int page_slots = 16;
  // Bytes of one stored k or v element: 4 (float32) or 2 (bf16). The storage's owner sets it
  // (host storage holds either; a device pool its own dtype), and every byte figure follows it.
  int kv_bytes = 4;
};

enum class Policy {
  kFpa,     // the learned rule: a key dies when lvl - phi >= tau / beta (no budget)
  kNone,    // full cache: nothing is evicted
  kWindow,  // keep the last N keys of each head
  kSinks,   // StreamingLLM: the first `sink_tokens` keys + the last N
  kH2O,     // heavy hitters by accumulated attention + a recent window
  kSnapKV,  // SnapKV: prompt keys by the attention of the prompt's last queries + the rest
  kTova,    // TOVA: the key the current query attends to least dies first
};

// "fpa" | "none" | "window" | "sinks" | "h2o" | "snapkv" | "tova"; InvalidArgument naming the
// value otherwise.
absl::StatusOr<Policy> parse_policy(std::string_view name);
std::string_view policy_name(Policy p);

struct PolicyConfig {
  Policy policy = Policy::kFpa;
  float tau = 20.0f;              // kFpa: eviction threshold in logit units
  float budget_fraction = 1.0f;   // heuristics: live keys per head <= ceil(fraction * length)
  int min_budget = 8;             // heuristics: never fewer live keys than this
  int sink_tokens = 4;            // kSinks
  float h2o_recent_share = 0.5f;  // kH2O: share of the budget kept as the recent window
  int snapkv_window = 32;         // kSnapKV: the prompt's last queries that score its keys
  int snapkv_pool = 7;            // kSnapKV: odd width of the max-pooling over key positions
  // kSnapKV: the prompt's length, so that the cache knows where its last window lies. Not a
  // request field: whoever starts the sequence with its prompt sets it.
  int64_t prompt_tokens = 0;
};

// What the attention kernels record in each key's acc, for the policies that rank keys by the
// attention they receive: the one thing the cache reads of the kernels' attention.
struct MassRule {
  enum class Mode {
    kNone,  // acc is left alone
    kAdd,   // each counted query adds its probability to acc (h2o, snapkv)
    kLast,  // acc holds the probability of the last counted query only (tova)
  };
  Mode mode = Mode::kNone;
  // Only queries at positions in [first_query, last_query] count (snapkv's observation window).
  int64_t first_query = 0;
  int64_t last_query = std::numeric_limits<int64_t>::max();

  // The counted rows [first, second) of an item of `len` queries from position `start_pos`
  // (an empty range under kNone).
  std::pair<int, int> rows(int64_t start_pos, int len) const;
};

// Pointers into host storage for one page (structure of arrays, `page_slots` entries each).
struct PageView {
  float* k;                 // [page_slots][head_dim], float32 host storage (else null)
  float* v;                 // [page_slots][head_dim]
  float* lvl;               // [page_slots]
  float* m;                 // [page_slots]; +inf when inserted, then min(m, phi) at each later step
  float* acc;               // [page_slots]; attention mass as the sequence's MassRule records it
  int32_t* pos;             // [page_slots]; token position, -1 for a free slot
  uint16_t* k16 = nullptr;  // [page_slots][head_dim], bf16 host storage (kv_bytes 2; else null)
  uint16_t* v16 = nullptr;
};

struct SlotRef {
  int32_t page = -1;
  int32_t slot = -1;
};

// Counters readable at any time from any thread (atomics inside), without stopping decoding.
struct CacheStats {
  int64_t pages_total = 0;
  int64_t pages_in_use = 0;
  int64_t live_slots = 0;       // live keys, all streams
  int64_t evicted_slots = 0;    // keys evicted since start (monotonic)
  int64_t full_cache_keys = 0;  // keys a full cache would hold now: sum of length*layers*heads
  int64_t pages_reserved = 0;   // held back for the step being planned (see KvCache::reserve)
  int64_t bytes_per_key = 0;    // k + v at kv_bytes, lvl, m, pos (+ acc with host storage)
  int64_t page_slots = 0;       // slots per page (for bytes_held)
  int64_t bytes_held() const;   // pages_in_use * page_slots * bytes_per_key
  int64_t bytes_full() const;   // full_cache_keys * bytes_per_key
  int64_t sequences = 0;
};

// Per-sequence figures for a request's usage report.
struct SequenceStats {
  int64_t length = 0;     // tokens appended so far
  int64_t live_keys = 0;  // over all layers and heads
  int64_t peak_live_keys = 0;
  int64_t pages = 0;
  int64_t full_keys = 0;         // length * layers * heads: what a full cache would hold
  double live_fraction() const;  // live_keys / full_keys (0 when empty)
};

class KvCache {
 public:
  // num_pages pages of page_slots slots. host_storage=false keeps only the bookkeeping (a
  // device backend holds the data, indexed by the same page ids and slots): page() then has
  // k = v = nullptr, while lvl, m, acc and pos stay on the host.
  // Calls for different (layer, head) streams may run concurrently; calls on the same stream,
  // and add_sequence / release, must not overlap other calls on that sequence.
  static absl::StatusOr<std::unique_ptr<KvCache>> create(CacheShape shape, int64_t num_pages,
                                                         bool host_storage = true);
  // Pages that fit in `bytes` for this shape, counted at bytes_per_key.
  static int64_t pages_for_bytes(CacheShape shape, int64_t bytes, bool host_storage = true);
  // What one slot of this storage holds: k and v at shape.kv_bytes, lvl, m, pos, and acc when
  // the host stores the keys (a device pool keeps no attention mass).
  static int64_t bytes_per_key(const CacheShape& shape, bool host_storage);
  virtual ~KvCache() = default;

  virtual const CacheShape& shape() const = 0;

  virtual absl::StatusOr<SeqId> add_sequence(const PolicyConfig& policy) = 0;
  // A new sequence in the state `seq` is in now (its live keys copied, densely packed, with
  // their levels, minima and masses, its eviction order and last phi), so that either can go
  // on alone. ResourceExhausted, nothing changed, when the unreserved pool cannot hold the copy.
  // A pool without host storage copies its keys through the attached device
  // (FailedPrecondition when none is: the copy would read another stream's keys there).
  virtual absl::StatusOr<SeqId> fork(SeqId seq) = 0;
  // The device that holds the keys of a pool without host storage (null: none), for the edits
  // the cache makes outside a step. Not owned; it must outlive the cache or be detached.
  virtual void attach_device(DevicePool* device) = 0;
  // Pages a fork of `seq` would take.
  virtual int64_t pages_to_fork(SeqId seq) const = 0;
  // Returns every page of the sequence to the pool at once. Unknown ids are ignored.
  virtual void release(SeqId seq) = 0;
  virtual const PolicyConfig& policy(SeqId seq) const = 0;

  // Worst-case number of free pages appending n_tokens to `seq` could take (every stream
  // opening new pages).
  virtual int64_t pages_needed(SeqId seq, int n_tokens) const = 0;
  // The step planner's one call (as vLLM's allocate_slots): before a step, holds back the
  // worst-case pages appending n_tokens to `seq` may take, so that the step cannot run out
  // midway. False, with nothing changed, when the pool cannot promise them: the caller preempts
  // or defers. Calling it again for the same sequence tops its reservation up; its inserts draw
  // from it first, and unreserve (or release) returns what the step did not use.
  virtual bool reserve(SeqId seq, int n_tokens) = 0;
  virtual void unreserve(SeqId seq) = 0;
  // Pages neither in use nor reserved.
  virtual int64_t free_pages() const = 0;

  virtual bool contains(SeqId seq) const = 0;
  // Tokens appended to the sequence so far: the one record of its position.
  virtual int64_t length(SeqId seq) const = 0;
  // The threshold the attention kernels exclude keys at for a head of penalty scale `beta`:
  // tau / beta under fpa (the keys it evicts are exactly those), +inf under every other policy.
  virtual float threshold(SeqId seq, float beta) const = 0;
  // What the kernels must record in each key's acc for the sequence's policy (MassRule::kNone
  // for the policies that do not rank keys by attention mass).
  virtual MassRule mass_rule(SeqId seq) const = 0;

  // Decode-step eviction for one stream, before the new key of position `pos` goes in:
  //  kFpa: frees every live key with lvl - phi >= tau / beta (beta <= 0: none);
  //  heuristics: frees keys so that, with the key at `pos` (inserted already or next), the
  //  stream holds its budget for length pos + 1. Returns how many keys were freed. Pages left
  //  empty are freed at once.
  virtual int evict_for_step(SeqId seq, int layer, int head, float phi, float beta,
                             int32_t pos) = 0;
  // Prefill-chunk eviction for the chunk ending at chunk_end_pos, after the chunk's attention:
  // keys cached before the chunk die when lvl - min_phi_chunk >= tau / beta. The chunk's own keys
  // carry m = min of phi over (pos, chunk_end_pos] (insert's `m`) and die when
  // lvl - m >= tau / beta: in this call when inserted before it, else at the next eviction call.
  // Heuristics: free keys until the stream holds budget(chunk_end_pos + 1).
  virtual int evict_for_chunk(SeqId seq, int layer, int head, float min_phi_chunk, float beta,
                              int32_t chunk_end_pos) = 0;

  // Takes a free slot of the stream (a new page when all are full) and records pos and lvl;
  // with host storage it also writes k, v (head_dim floats each), m = `m`, acc = 0.
  // ResourceExhausted when the pool is empty; the cache is unchanged then.
  virtual absl::StatusOr<SlotRef> insert(SeqId seq, int layer, int head, int32_t pos, float lvl,
                                         const float* k, const float* v,
                                         float m = std::numeric_limits<float>::infinity()) = 0;

  // Counts keys that died before they were cached (within their own prompt chunk) as evicted.
  virtual void count_dropped(int64_t keys) = 0;

  // The field's running value phi_{pos} of a stream (0 before its first token): a backend
  // reads it to extend the walk and stores the new value after each step or chunk.
  virtual float last_phi(SeqId seq, int layer, int head) const = 0;
  virtual void set_last_phi(SeqId seq, int layer, int head, float phi) = 0;

  // The stream's pages, for a kernel to walk (slots with pos == -1 are free).
  virtual std::span<const int32_t> pages(SeqId seq, int layer, int head) const = 0;
  virtual PageView page(int32_t page_id) = 0;  // k, v: host storage only (see create)

  // Merges sparse pages of a stream when that frees at least one page. Each moved slot is
  // reported to `on_move` (a device backend copies its mirror). Returns pages freed.
  virtual int compact(SeqId seq, int layer, int head,
                      const std::function<void(SlotRef from, SlotRef to)>& on_move = {}) = 0;

  virtual CacheStats stats() const = 0;  // thread-safe
  virtual SequenceStats sequence_stats(SeqId seq) const = 0;
};

}  // namespace fpa::cache
