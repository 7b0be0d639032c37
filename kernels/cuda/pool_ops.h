// The page-pool edits the host bookkeeping hands to the device (plain C++17: .cu files use it).
#pragma once

#include "cache/pool_edits.h"

namespace fpa::cuda {

using cache::KeyWrite;
using cache::SlotCopy;
using cache::SlotMove;

}  // namespace fpa::cuda
