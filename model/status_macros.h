// Early return on error (this abseil release ships no public RETURN_IF_ERROR).
#pragma once

#include "absl/status/status.h"

#define FPA_RETURN_IF_ERROR(expr)                       \
  do {                                                  \
    if (::absl::Status fpa_s_ = (expr); !fpa_s_.ok()) { \
      return fpa_s_;                                    \
    }                                                   \
  } while (0)
