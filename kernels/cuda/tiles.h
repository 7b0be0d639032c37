// Sizes both the host's step planning (C++20) and the kernels (C++17) must agree on.
#pragma once

namespace fpa::cuda {

// Rows of a prompt chunk the tensor-core prefill takes at once (prefill_tc.cu); step_plan.h's
// chunk_tiles lays the work list out in tiles of this many rows.
inline constexpr int kChunkTile = 16;

}  // namespace fpa::cuda
