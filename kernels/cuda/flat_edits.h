// The edits the cache sends the CUDA pool over a step (cache::DevicePool::apply), queued in one
// array per kind so that the step uploads each kind once however many layers it settles, and
// replays them layer by layer in order (a page one layer's update frees may be the next one's).
#pragma once

#include <cstdint>
#include <vector>

#include "cache/device_pool.h"

namespace fpa::cuda {

struct FlatEdits {
  struct Range {
    int32_t first = 0;
    int32_t count = 0;
  };
  struct Layer {
    Range resets, writes, moves;
  };
  std::vector<int32_t> resets;
  std::vector<cache::KeyWrite> writes;
  std::vector<cache::SlotMove> moves;
  std::vector<Layer> layers;  // in the order they came

  // Queues a layer's edits; its writes' rows move by `row_shift`, where the layer's rows sit
  // among the rows the step keeps (a decode step keeps every layer's: layer * rows).
  void append(const cache::LayerEdits& edits, int32_t row_shift);
  void clear();
};

}  // namespace fpa::cuda
