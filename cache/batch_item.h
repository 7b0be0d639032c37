// One sequence's part of a step, under one name from the scheduler through the runner and the
// backends down to the cache's per-layer update.
#pragma once

#include <cstdint>
#include <span>

#include "cache/kv_cache.h"

namespace fpa::cache {

// `tokens` (a prompt chunk, or the one token sampled last step) are appended at positions
// start_pos, start_pos + 1, ...; start_pos is where the sequence stopped (KvCache::length), which
// the runner and the backends check. A batch lays its items' tokens out as rows, item after item.
struct BatchItem {
  SeqId seq = -1;
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
};

}  // namespace fpa::cache
