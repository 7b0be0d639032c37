// One (sequence, layer, head) of the cache: its pages and the order its live keys die in.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/page_table.h"
#include "cache/slot_heap.h"

namespace fpa::cache {

// A slot's `where` (PageTable::where): >= 0 its index in `order`, <= -2 its index in `pending`
// (-2 - index), -1 in neither (h2o, tova and none keep no order, nor snapkv for its scored
// prompt keys).
constexpr int32_t pending_where(size_t index) { return -2 - static_cast<int32_t>(index); }

struct Stream {
  explicit Stream(int32_t* where) : order(where) {}

  StreamPages pages;
  // fpa: live keys by level (highest on top); window, sinks and snapkv's unscored keys: by age
  // (oldest on top).
  SlotHeap order;
  // fpa: keys inserted since the last eviction call; they join `order` once the field they must
  // be judged against is known (see evict_chunk).
  std::vector<int32_t> pending;
  std::vector<int32_t> scratch;  // reused for the slots an eviction call frees
  int32_t last_pos = -1;         // last inserted position
  int32_t horizon = -1;          // last position whose field value eviction has applied
  float last_phi = 0.0f;
  bool scored = false;  // snapkv: the scored prompt keys hold their pooled scores in acc
};

}  // namespace fpa::cache
