// The eviction policies behind one small interface (docs/fpa.md sections 2 and 3 for fpa; window,
// sinks, h2o, snapkv and tova as heuristics at a budget). A rule frees the dying slots of one
// stream through the page table and tells the kernels what they need of it; nothing outside cache/
// names a policy.
#pragma once

#include <cstdint>
#include <memory>

#include "cache/kv_cache.h"
#include "cache/page_table.h"
#include "cache/stream.h"

namespace fpa::cache {

class EvictionRule {
 public:
  virtual ~EvictionRule() = default;

  // The threshold on lvl - m the attention kernels exclude keys at (+inf: they exclude none).
  virtual float threshold(float beta) const = 0;
  // Whether that threshold alone excludes every key the rule evicts, so a backend that never
  // learns which slots were freed (a device mirror) still attends over exactly the live keys.
  virtual bool kernels_exclude_evicted() const = 0;
  // What the kernels record in acc for a rule that ranks keys by the attention they receive.
  virtual MassRule mass_rule() const { return {}; }

  // Registers a just-inserted slot with the stream's ordering structure.
  virtual void track(PageTable& table, Stream& stream, int32_t gslot) = 0;
  // Before the key at `pos` goes in (after it, under MassRule::kLast): fpa frees keys with
  // lvl - phi >= tau / beta; the heuristics free keys until the stream, with that key, holds
  // budget(pos + 1).
  virtual int evict_step(PageTable& table, Stream& stream, float phi, float beta, int32_t pos) = 0;
  // After a prompt chunk ending at `end_pos` went in (`horizon_before`: the last position whose
  // field eviction had applied before it): fpa frees keys cached before the chunk with
  // lvl - min_phi >= tau / beta and the chunk's own keys with lvl - m >= tau / beta, m being
  // their stored running minimum; the heuristics free keys until the stream holds
  // budget(end_pos + 1).
  virtual int evict_chunk(PageTable& table, Stream& stream, float min_phi, float beta,
                          int32_t end_pos, int32_t horizon_before) = 0;
};

// The rule of a validated policy.
std::unique_ptr<EvictionRule> make_rule(const PolicyConfig& policy);

// Whether tokens fed as one chunk compute what feeding them one at a time does once the chunk's
// own evictions are applied: true when the kernels exclude every key the rule evicts. Under the
// heuristics a chunk's rows attend over keys a token-by-token run had already evicted, so a
// recompute replays generated tokens one at a time and a prefix state serves only runs built
// the same way (see Scheduler).
bool chunks_replay_decode(const PolicyConfig& policy);

}  // namespace fpa::cache
