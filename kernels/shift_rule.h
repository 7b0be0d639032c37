// FoX Pro's key / value shift carries each sequence's last k and v projection rows of every layer
// from one forward to the next (kernels/cpu/shift_state.h, kernels/cuda/shift_slots.h). The rule
// both backends keep: an item at position 0 starts from zero rows; any other item must continue
// where its sequence's last forward ended.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"

namespace fpa {

// Whether `item` may run, its sequence's rows standing at `next_pos` (none: the backend holds no
// rows for it, as after a fork or a prefix-cache hit).
inline absl::Status check_shift_continues(const cache::BatchItem& item,
                                          std::optional<int32_t> next_pos) {
  if (item.start_pos == 0 || next_pos == item.start_pos) return absl::OkStatus();
  // TODO(issue 25): carry the shift rows with forks and prefix-cache entries.
  return absl::FailedPreconditionError(absl::StrCat(
      "forward: sequence ", item.seq, " starts at position ", item.start_pos,
      " without the key/value shift state of the position before (a fork or a prefix-cache hit, "
      "which FoX Pro's shift does not support yet)"));
}

}  // namespace fpa
