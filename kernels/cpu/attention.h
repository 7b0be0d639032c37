// FPA attention of one stream (sequence, layer, head) on the CPU: over the paged cache for a
// decode token, over cached keys plus a causal prompt chunk for prefill (docs/fpa.md
// sections 1, 3 and 4). Softmax is beta = 0, FoX is tied levels with beta = 1.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "cache/kv_cache.h"

namespace fpa::cpu {

// A head's penalty scale and the fpa policy's eviction rule: a key with lvl - m >= threshold
// (tau / beta) is excluded, exactly as if evicted; threshold = +inf never excludes.
struct Penalty {
  float beta = 0.0f;
  float threshold = std::numeric_limits<float>::infinity();
};

// Which queries of one kernel call record attention mass in the keys' acc, and how: the
// sequence's cache::MassRule resolved to the call's query rows.
struct MassRows {
  cache::MassRule::Mode mode = cache::MassRule::Mode::kAdd;
  // Rows [begin, end) count: kAdd adds each one's probabilities, kLast stores the last one's.
  int begin = 0;
  int end = 1 << 30;
  bool counts(int row) const {
    return mode != cache::MassRule::Mode::kNone && row >= begin && row < end;
  }
};

// The live keys of one stream as the cache holds them: its pages, page_slots slots each.
struct CachedKeys {
  std::span<const cache::PageView> pages;
  int page_slots = 0;
  MassRows mass;  // only the policies that rank keys by attention mass have the kernels write it
};

// The decode token's own key and value: not cached yet (the cache takes it after the step), and
// never penalised (no dip lies between a key and itself).
struct OwnKey {
  const float* k = nullptr;
  const float* v = nullptr;
};

// One query over the cached keys and its own key. Updates every cached key's m = min(m, phi),
// records each cached key's softmax probability in its acc when the query counts (mass row 0:
// added, or stored under kLast), writes out[head_dim] and returns the own key's mass: its
// probability when the query counts, else 0.
// `then`: the pages of the stream the calling thread reads next, where it knows them; their
// first pages are fetched while this stream's last ones are read.
float decode_attention(const float* q, float phi, OwnKey own, Penalty pen, int head_dim,
                       const CachedKeys& keys, float* out,
                       std::span<const cache::PageView> then = {});

// A prompt chunk of one head: n queries and keys at consecutive positions. q/k/v/out rows
// have stride `stride`; phi and lvl are the chunk's field and levels [n].
struct Chunk {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  long stride = 0;
  const float* phi = nullptr;
  const float* lvl = nullptr;
  int n = 0;
};

// Attends every chunk query over the cached keys (m = min(stored m, prefix-min of phi up to
// the query)) and the chunk keys up to it (m = min of phi over (key, query]), leaving out the
// keys the eviction rule excludes by then, so any chunking gives step-by-step decode's output.
// Afterwards the cached keys hold m = min(m, min phi of the chunk), their acc as keys.mass says
// (grown by the counted rows' probabilities, or those of the last counted row under kLast: a
// chunk scores its keys by its last query, as decode would have by the end of the chunk), and
// chunk_acc[n] the chunk keys' mass recorded the same way (0 when no row counts).
void prefill_attention(const Chunk& chunk, Penalty pen, int head_dim, const CachedKeys& keys,
                       float* out, float* chunk_acc);

}  // namespace fpa::cpu
