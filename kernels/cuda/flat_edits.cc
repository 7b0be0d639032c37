#include "kernels/cuda/flat_edits.h"

namespace fpa::cuda {
namespace {

FlatEdits::Range range(size_t first, size_t count) {
  return {static_cast<int32_t>(first), static_cast<int32_t>(count)};
}

}  // namespace

void FlatEdits::append(const cache::LayerEdits& edits, int32_t row_shift) {
  layers.push_back({range(resets.size(), edits.reset_pages.size()),
                    range(writes.size(), edits.writes.size()),
                    range(moves.size(), edits.moves.size())});
  resets.insert(resets.end(), edits.reset_pages.begin(), edits.reset_pages.end());
  for (cache::KeyWrite w : edits.writes) {
    w.row += row_shift;
    writes.push_back(w);
  }
  moves.insert(moves.end(), edits.moves.begin(), edits.moves.end());
}

void FlatEdits::clear() {
  resets.clear();
  writes.clear();
  moves.clear();
  layers.clear();
}

}  // namespace fpa::cuda
