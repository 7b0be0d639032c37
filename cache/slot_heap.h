// An indexed binary max-heap of a stream's live slots: O(log n) push and pop, and O(1) lookup of
// a slot's heap position (kept in a caller-owned `where` array, indexed by global slot id) so
// that compaction can move a slot without searching.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fpa::cache {

class SlotHeap {
 public:
  struct Entry {
    double key;    // exact for a float level and for an int32 position
    int32_t slot;  // global slot id: page * page_slots + slot
  };

  explicit SlotHeap(int32_t* where) : where_(where) {}

  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  const Entry& top() const { return heap_.front(); }
  std::span<const Entry> entries() const { return heap_; }

  void push(double key, int32_t slot);
  void pop();  // where[top slot] becomes -1
  // The slot stored at heap index `index` moved to global slot `slot` (same key).
  void relocate(int32_t index, int32_t slot);
  void clear();  // where[] of every entry becomes -1

 private:
  void place(size_t index, Entry entry);
  void sift_up(size_t index);
  void sift_down(size_t index);

  std::vector<Entry> heap_;
  int32_t* where_;
};

}  // namespace fpa::cache
