// The eviction policies (docs/fpa.md sections 2 and 3 for fpa; window, sinks, h2o as heuristics at
// a budget). Each frees the dying slots of one stream through the page table and returns how
// many it freed.
#pragma once

#include <cstdint>

#include "cache/kv_cache.h"
#include "cache/page_table.h"
#include "cache/stream.h"

namespace fpa::cache {

// Registers a just-inserted slot with the stream's ordering structure.
void track_inserted(PageTable& table, Stream& stream, const PolicyConfig& policy, int32_t gslot);

// Before the key at `pos` goes in: fpa frees keys with lvl - phi >= tau / beta; the heuristics
// free keys until the stream holds budget(pos + 1) - 1.
int evict_step(PageTable& table, Stream& stream, const PolicyConfig& policy, float phi, float beta,
               int32_t pos);

// Between prefill chunks, the chunk ending at `end_pos`: fpa frees keys cached before the chunk
// with lvl - min_phi >= tau / beta, and keys of the chunk itself (inserted before this call)
// with lvl - m >= tau / beta, m being their stored running minimum; the heuristics free keys
// until the stream holds budget(end_pos + 1).
int evict_chunk(PageTable& table, Stream& stream, const PolicyConfig& policy, float min_phi,
                float beta, int32_t end_pos);

}  // namespace fpa::cache
