#include "cache/slot_heap.h"

#include <utility>

namespace fpa::cache {

void SlotHeap::place(size_t index, Entry entry) {
  heap_[index] = entry;
  where_[entry.slot] = static_cast<int32_t>(index);
}

void SlotHeap::sift_up(size_t index) {
  const Entry entry = heap_[index];
  while (index > 0) {
    const size_t parent = (index - 1) / 2;
    if (!(heap_[parent].key < entry.key)) break;
    place(index, heap_[parent]);
    index = parent;
  }
  place(index, entry);
}

void SlotHeap::sift_down(size_t index) {
  const Entry entry = heap_[index];
  const size_t n = heap_.size();
  while (true) {
    size_t child = 2 * index + 1;
    if (child >= n) break;
    if (child + 1 < n && heap_[child].key < heap_[child + 1].key) ++child;
    if (!(entry.key < heap_[child].key)) break;
    place(index, heap_[child]);
    index = child;
  }
  place(index, entry);
}

void SlotHeap::push(double key, int32_t slot) {
  heap_.push_back({key, slot});
  sift_up(heap_.size() - 1);
}

void SlotHeap::pop() {
  where_[heap_.front().slot] = -1;
  heap_.front() = heap_.back();
  heap_.pop_back();
  if (!heap_.empty()) sift_down(0);
}

void SlotHeap::relocate(int32_t index, int32_t slot) {
  heap_[static_cast<size_t>(index)].slot = slot;
  where_[slot] = index;
}

void SlotHeap::clear() {
  for (const Entry& e : heap_) where_[e.slot] = -1;
  heap_.clear();
}

}  // namespace fpa::cache
