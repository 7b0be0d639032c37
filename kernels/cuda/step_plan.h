// Host side of a CUDA forward step, free of CUDA so CPU-only builds test it: checks a batch,
// lays its tokens out as rows, snapshots the page tables the attention kernel walks, and runs the
// host cache's eviction and insertion for one layer, returning what the device must mirror.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cuda/pool_ops.h"

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

// Unimplemented for the heuristic policies: their evictions need per-slot state (h2o's attention
// mass) that the device does not mirror back.
absl::Status check_policy(const cache::PolicyConfig& policy);

// InvalidArgument for a malformed batch (empty item, bad token, repeated sequence, short logits
// span), Unimplemented for a policy the CUDA backend cannot mirror, ResourceExhausted when the
// pool cannot take the step. Nothing is changed.
absl::StatusOr<BatchLayout> plan_batch(std::span<const ForwardItem> items, size_t logits_size,
                                       bool all_logits, const ModelDims& dims,
                                       const cache::KvCache& cache);

// Eviction threshold tau / beta per (item, head), +inf where nothing can be evicted.
std::vector<float> eviction_thresholds(std::span<const ForwardItem> items,
                                       std::span<const float> beta, const cache::KvCache& cache);

// The streams' current page lists, flattened: stream (item, head) owns
// ids[offset[s] .. offset[s] + count[s]).
struct PageTables {
  std::vector<int32_t> ids, offset, count;
  int max_count = 0;
};
PageTables snapshot_page_tables(std::span<const ForwardItem> items, int layer, int n_heads,
                                const cache::KvCache& cache);

// Per-row, per-head field values of one layer, copied back from the device ([rows][n_heads]).
struct FieldRows {
  std::span<const float> phi;   // the walk
  std::span<const float> lvl;   // the keys' levels
  std::span<const float> cmin;  // min phi from the item's first row to this row
  std::span<const float> smin;  // min phi after this row to the item's last row (+inf: none)
};

struct LayerUpdate {
  std::vector<int32_t> reset_pages;  // newly taken pages: every slot must read as free first
  std::vector<KeyWrite> writes;
  std::vector<SlotMove> moves;
  int64_t evicted = 0;
};

// Runs one layer's bookkeeping in step order for every (item, head): evict with the last phi (a
// one-token item) or the chunk's minimum phi (a prompt chunk), insert the chunk's keys that are
// still live at its end (m = their suffix minimum) and store the last phi; then compact the
// streams that lost keys. The device applies reset_pages, then writes, then moves (in order).
absl::StatusOr<LayerUpdate> update_layer(std::span<const ForwardItem> items,
                                         const BatchLayout& layout, int layer,
                                         std::span<const float> beta,
                                         std::span<const float> thresholds, const FieldRows& field,
                                         cache::KvCache& cache);

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
