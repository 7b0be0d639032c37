// The kernels' read view of the cache: where a sequence's live keys are (pages, page) and how
// to read them (the threshold to exclude keys at, what to record in acc, the field's last value).
// The attention kernels and the backends' step planning read the cache through it only.
#pragma once

#include <cstdint>
#include <span>

#include "cache/kv_types.h"

namespace fpa::cache {

class KvView {
 public:
  virtual ~KvView() = default;

  virtual const CacheShape& shape() const = 0;
  virtual bool contains(SeqId seq) const = 0;
  // Tokens appended to the sequence so far: the one record of its position.
  virtual int64_t length(SeqId seq) const = 0;
  // The threshold the attention kernels exclude keys at for a head of penalty scale `beta`:
  // tau / beta under fpa (the keys it evicts are exactly those), +inf under every other policy.
  virtual float threshold(SeqId seq, float beta) const = 0;
  // What the kernels must record in each key's acc for the sequence's policy (MassRule::kNone
  // for the policies that do not rank keys by attention mass).
  virtual MassRule mass_rule(SeqId seq) const = 0;
  // The field's running value phi_{pos} of a stream (0 before its first token): a backend reads
  // it to extend the walk; the layer update stores the new value after each step or chunk.
  virtual float last_phi(SeqId seq, int layer, int head) const = 0;
  // The stream's pages, for a kernel to walk (slots with pos == -1 are free).
  virtual std::span<const int32_t> pages(SeqId seq, int layer, int head) const = 0;
  virtual PageView page(int32_t page_id) = 0;  // k, v: host storage only (see KvCache::create)
  // Where the pages lie, for a backend that views many: layout().view(id) is page(id) for an id
  // of the cache's own lists, computed in line (page checks the id, behind a virtual call).
  virtual const PageLayout& layout() const = 0;
};

}  // namespace fpa::cache
