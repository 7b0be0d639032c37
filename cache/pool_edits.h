// The edits a step makes to a device mirror of the pool (plain C++17: .cu files use it).
#pragma once

#include <cstdint>

namespace fpa::cache {

// A new key: slot_index = page * page_slots + slot; its k and v are head `head` of token row
// `row` of the step's activations.
struct KeyWrite {
  int32_t slot_index;
  int32_t row;
  int32_t head;
  int32_t pos;
  float lvl;
  float m;
};

// compact() moved a key (slot indices as in KeyWrite); moves apply in order.
struct SlotMove {
  int32_t from;
  int32_t to;
};

// A fork copied a key into its own slot (slot indices as in KeyWrite); the source stays live.
struct SlotCopy {
  int32_t from;
  int32_t to;
};

}  // namespace fpa::cache
