// The cache's vocabulary: shapes, policies, slot views and statistics, shared by the pool
// (kv_cache.h), the kernels' read view (kv_view.h) and the per-stream edits (stream_editor.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"

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

// Where a host pool's pages lie: page p's arrays at base + p * stride, each at its offset. Views
// are computed from it in line: through a virtual call per page, viewing a batch-32 decode step's
// pages took 3.6-4.0% of its samples, in line 1.7-2.7% (bench/RESULTS.md, tenth session).
struct PageLayout {
  std::byte* base = nullptr;
  size_t stride = 0;
  size_t v = 0, lvl = 0, m = 0, acc = 0, pos = 0;  // byte offsets within a page; k is at 0
  int kv_bytes = 0;                                // 4: float32 k and v, 2: bf16, 0: none

  PageView view(int32_t page) const {
    std::byte* p = base + static_cast<size_t>(page) * stride;
    PageView out{};
    if (kv_bytes == 4) {
      out.k = reinterpret_cast<float*>(p);
      out.v = reinterpret_cast<float*>(p + v);
    } else if (kv_bytes == 2) {
      out.k16 = reinterpret_cast<uint16_t*>(p);
      out.v16 = reinterpret_cast<uint16_t*>(p + v);
    }
    out.lvl = reinterpret_cast<float*>(p + lvl);
    out.m = reinterpret_cast<float*>(p + m);
    out.acc = reinterpret_cast<float*>(p + acc);
    out.pos = reinterpret_cast<int32_t*>(p + pos);
    return out;
  }
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

}  // namespace fpa::cache
