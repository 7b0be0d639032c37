// Pages and slots: the pool's storage (one aligned host allocation, structure of arrays within
// a page) and each page's slot bookkeeping. A stream owns a list of pages; a slot is addressed
// by its global id `page * page_slots + slot`. Calls for different streams may run in parallel:
// a page's bookkeeping is touched only by its owner, the free list only under the ledger's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/huge_pages.h"
#include "cache/kv_cache.h"
#include "cache/page_ledger.h"

namespace fpa::cache {

// The pages of one stream; `live` counts its live slots.
struct StreamPages {
  std::vector<int32_t> pages;
  std::vector<int32_t> nonfull;  // pages of `pages` with at least one free slot
  int64_t live = 0;
  // The stream's counter changes not yet in the ledger: they go with the next page it takes or
  // returns (so the ledger never shows more live keys than its pages hold, nor an empty page), or
  // with KvCache's settle (StreamEditor). One ledger lock a page, not two a key: the lock is shared
  // by the threads that edit other streams.
  LedgerDelta unsettled;
};

class PageTable {
 public:
  // Bytes per slot of the storage: k and v at shape.kv_bytes, lvl, m, pos, and acc with host
  // storage (the host then keeps the attention mass beside the keys; a device pool has none).
  static int64_t bytes_per_key(const CacheShape& shape, bool host_storage);
  static absl::StatusOr<std::unique_ptr<PageTable>> create(const CacheShape& shape,
                                                           int64_t num_pages, bool host_storage);

  int32_t slots() const { return slots_; }
  int64_t num_pages() const { return num_pages_; }
  bool host_storage() const { return host_storage_; }
  PageLedger& ledger() { return ledger_; }
  const PageLedger& ledger() const { return ledger_; }

  // Where the pages lie (the pool never moves), for views computed in line.
  const PageLayout& layout() const { return layout_; }
  // k and v are null without host storage; lvl, m, acc and pos are always on the host.
  PageView view(int32_t page) const { return layout_.view(page); }
  float lvl(int32_t gslot) const { return view(gslot / slots_).lvl[gslot % slots_]; }
  float m(int32_t gslot) const { return view(gslot / slots_).m[gslot % slots_]; }
  float acc(int32_t gslot) const { return view(gslot / slots_).acc[gslot % slots_]; }
  int32_t pos(int32_t gslot) const { return view(gslot / slots_).pos[gslot % slots_]; }
  // Position of the slot in its stream's ordering structure (the stream's to interpret).
  int32_t& where(int32_t gslot) { return where_[static_cast<size_t>(gslot)]; }
  int32_t* where_data() { return where_.data(); }

  // A free slot of the stream (a page from the pool when all its pages are full: from
  // `*reservation` first, in the layer's region of the pool where one is free there), counted live
  // together with `full_keys_delta` (in the stream's unsettled counters). ResourceExhausted,
  // nothing changed, when no page is free for it.
  absl::StatusOr<int32_t> take_slot(StreamPages& stream, int layer, int64_t full_keys_delta,
                                    int64_t* reservation);
  // A copy of slot `from` (any stream's) in a free slot of `stream`, counted live. Pages come
  // from the unreserved pool, in the region `from` is in where one is free there;
  // ResourceExhausted, nothing changed, when there is none.
  absl::StatusOr<int32_t> clone_slot(StreamPages& stream, int32_t from);
  // Writes a taken slot's contents (k, v only with host storage; acc = 0).
  void write_slot(int32_t gslot, int32_t pos, float lvl, float m, const float* k, const float* v);
  // Frees the slots (pos = -1); pages left without a live slot go back to the pool at once.
  void free_slots(StreamPages& stream, std::span<const int32_t> gslots, bool evicted);
  // Returns every page of the stream; `full_keys` is what the stream counted as full-cache keys.
  void release(StreamPages& stream, int64_t full_keys);
  // Moves live slots out of the stream's sparsest pages into its fullest ones when that frees at
  // least one page; reports each move (from, to) before the source slot is cleared. Pages freed.
  int compact(StreamPages& stream, const std::function<void(int32_t from, int32_t to)>& moved);

  // Hints, which change nothing: start fetching a slot's level, minimum, position and place in
  // its stream's order; a page's bookkeeping and the first line of each of its slot fields.
  void prefetch_slot(int32_t gslot) const;
  void prefetch_page(int32_t page) const;

 private:
  PageTable(const CacheShape& shape, int64_t num_pages, bool host_storage, HugeBuffer base);
  int32_t claim(StreamPages& stream, int32_t page);  // a free slot of an owned page
  bool unclaim(StreamPages& stream, int32_t gslot);  // true when the page emptied
  void adopt(StreamPages& stream, int32_t page);     // a fresh page joins the stream
  void drop(StreamPages& stream, int32_t page);      // an empty page leaves the stream
  // Returns dropped pages to the pool with the stream's unsettled counters, as one change.
  void return_pages(StreamPages& stream, std::span<const int32_t> pages);
  void copy_slot(int32_t from, int32_t to);
  std::byte* kv_row(int32_t gslot, bool value) const;  // host storage: the slot's k or v bytes

  struct PageInfo {
    int32_t live = 0;
    int32_t free_head = -1;   // first free slot (index within the page), linked by next_free_
    int32_t list_index = -1;  // index in the owner's `pages`
    int32_t nonfull_index = -1;
  };

  const int32_t slots_;
  const int32_t head_dim_;
  const int64_t num_pages_;
  const bool host_storage_;
  const int kv_bytes_;  // 4: float32 k and v; 2: bf16
  const HugeBuffer base_;
  PageLayout layout_;
  std::vector<PageInfo> info_;
  std::vector<int32_t> next_free_;  // per global slot
  std::vector<int32_t> where_;      // per global slot
  PageLedger ledger_;
};

}  // namespace fpa::cache
