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
// rows for it: on the CUDA backend after a fork or a prefix-cache hit, whose shift rows the CPU
// backend's forks carry and the CUDA backend's do not yet).
inline absl::Status check_shift_continues(const cache::BatchItem& item,
                                          std::optional<int32_t> next_pos) {
  if (item.start_pos == 0 || next_pos == item.start_pos) return absl::OkStatus();
  // TODO(issue 25): the CUDA backend's shift slots carried with forks, as the CPU's rows are.
  return absl::FailedPreconditionError(
      absl::StrCat("forward: sequence ", item.seq, " starts at position ", item.start_pos,
                   " without the key/value shift state of the position before"));
}

}  // namespace fpa
