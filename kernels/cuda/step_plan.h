// Host side of a CUDA forward step, free of CUDA so CPU-only builds test it: checks a batch,
// lays its tokens out as rows and snapshots the page tables the attention kernel walks. The
// cache's eviction and insertion for a layer is cache::apply_layer, as for every backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_view.h"
#include "cache/layer_update.h"
#include "kernels/backend.h"
#include "kernels/cuda/tiles.h"

namespace fpa::cuda {

// The batch's tokens as rows, item after item.
struct BatchLayout {
  int rows = 0;
  std::vector<int32_t> tokens;                          // [rows]
  std::vector<int32_t> row_item;                        // [rows]
  std::vector<int32_t> row_pos;                         // [rows] token position
  std::vector<int32_t> item_row0, item_len, item_pos0;  // [items]
  std::vector<int32_t> out_rows;  // rows whose logits are returned, in output order
};

struct ModelDims {
  int vocab_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int head_dim = 0;
};

// Unimplemented for a policy whose evictions the attention kernels' threshold does not cover:
// the device never learns which slots the host freed, only which keys the threshold excludes.
absl::Status check_policy(const cache::PolicyConfig& policy);

// InvalidArgument for a malformed batch (empty item, bad token, repeated sequence, short logits
// span). Nothing is changed. Whether the step fits the pool is the planner's (KvCache::reserve).
absl::StatusOr<BatchLayout> plan_batch(std::span<const cache::BatchItem> items, size_t logits_size,
                                       bool all_logits, const ModelDims& dims);

// The threshold per (item, head) the kernels exclude keys at, as the cache's policy says.
std::vector<float> eviction_thresholds(std::span<const cache::BatchItem> items,
                                       std::span<const float> beta, const cache::KvView& cache);

// The streams' current page lists, flattened: stream (item, head) owns
// ids[offset[s] .. offset[s] + count[s]).
struct PageTables {
  std::vector<int32_t> ids, offset, count;
  int max_count = 0;
};
PageTables snapshot_page_tables(std::span<const cache::BatchItem> items, int layer, int n_heads,
                                const cache::KvView& cache);

// The first row of every kChunkTile-row tile of the items longer than one token (the prompt
// chunks), tiles aligned to each item's first row: the tensor-core prefill's work list.
std::vector<int32_t> chunk_tiles(std::span<const int32_t> item_row0,
                                 std::span<const int32_t> item_len);

// How many parts each (row, head) splits its cached keys into: enough warps to fill the device
// (about 128 per SM on a 132-SM H200), never fewer than 32 keys (one warp tile) a part.
inline int attention_splits(int pairs, int max_keys) {
  constexpr int kTargetWarps = 16384;
  constexpr int kMinKeysPerSplit = 32;
  return std::clamp((kTargetWarps + pairs - 1) / pairs, 1,
                    std::max(1, max_keys / kMinKeysPerSplit));
}

// Benchmarks: the last `keep_last` of n_tokens keys of a walk falling by -phi_step per token
// from phi0, with tied levels: token offset, level and running minimum m at the end.
struct SyntheticKey {
  int offset;
  float lvl;
  float m;
};
std::vector<SyntheticKey> synthetic_walk(int n_tokens, float phi0, float phi_step, int keep_last);

}  // namespace fpa::cuda
