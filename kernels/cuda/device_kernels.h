// Launchers of the CUDA kernels (attention.cu, layer_ops.cu), callable from host C++.
// Activations are float32 row-major [rows][width]; every launcher returns the launch's error,
// naming the kernel, and with FPA_CUDA_SYNC=1 the kernel's own (launch_check.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/pool_ops.h"
#include "kernels/cuda/tiles.h"

namespace fpa::cuda {

inline constexpr int kMaxHeadDim = 256;

enum class KvType { kBf16, kF32 };

// The device page pool: structure of arrays indexed by slot index = page * page_slots + slot.
struct PoolView {
  void* k = nullptr;  // [pages * page_slots][head_dim] of `type`
  void* v = nullptr;
  float* lvl = nullptr;
  float* m = nullptr;
  int32_t* pos = nullptr;  // -1: free slot
  int page_slots = 0;
  int head_dim = 0;
  KvType type = KvType::kBf16;
};

// One layer's attention over a batch laid out as rows (step_plan.h BatchLayout, uploaded).
struct AttentionArgs {
  const float* qkv = nullptr;  // [rows][qkv_stride]: q | k | v, head h at h * head_dim
  int qkv_stride = 0;
  const float* phi = nullptr;   // [rows][n_heads]
  const float* lvl = nullptr;   // [rows][n_heads]
  const float* cmin = nullptr;  // [rows][n_heads]
  const int32_t* row_item = nullptr;
  const int32_t* item_row0 = nullptr;
  const int32_t* item_len = nullptr;
  const int32_t* item_pos0 = nullptr;
  const float* thr = nullptr;         // [items][n_heads]
  const float* beta = nullptr;        // [n_heads]
  const int32_t* page_ids = nullptr;  // PageTables, as before this step's eviction and inserts
  const int32_t* page_off = nullptr;
  const int32_t* page_cnt = nullptr;
  int rows = 0;
  int items = 0;
  int n_heads = 0;
  int splits = 1;              // each (row, head) splits its cached pages into this many parts
  float* partial = nullptr;    // [rows][n_heads][splits][head_dim + 2]
  float* out = nullptr;        // [rows][n_heads * head_dim]
  int32_t* retired = nullptr;  // when set, += the cached keys the kernels marked dead
  // The first row of every kChunkTile-row tile of the prompt chunks (step_plan.h chunk_tiles):
  // with a pool prefill_tc_fits, those rows are attended on tensor cores.
  const int32_t* tc_tiles = nullptr;
  int n_tc_tiles = 0;
  bool chunks_on_tensor_cores = false;  // set by launch_attention: the warp kernel skips them
};
// Attention of every row over its sequence's cached keys and its own chunk's keys up to itself,
// then the split combine, then (prompt chunks) the cached keys' m update and dead-key marking.
// One-token items update m and mark their dead keys in place during the attention pass.
absl::Status launch_attention(const AttentionArgs& args, const PoolView& pool, cudaStream_t stream);

// Replays a layer's cache::LayerEdits: resets, then key writes (k, v from qkv), then moves in
// order.
absl::Status launch_pool_update(const PoolView& pool, const int32_t* reset_pages, int n_resets,
                                const KeyWrite* writes, int n_writes, const SlotMove* moves,
                                int n_moves, const float* qkv, int qkv_stride, int n_heads,
                                cudaStream_t stream);
// A fork's copies (cache::DevicePool::copy_slots): resets the pages, then copies each slot's k,
// v, lvl, m and pos; the sources stay live.
absl::Status launch_slot_copies(const PoolView& pool, const int32_t* reset_pages, int n_resets,
                                const SlotCopy* copies, int n_copies, cudaStream_t stream);
// out[i * page_slots + s] = pos of slot s of pages[i] (tests read the live sets back).
absl::Status launch_gather_pos(const PoolView& pool, const int32_t* pages, int n_pages,
                               int32_t* out, cudaStream_t stream);
// Benchmarks: random k and v (a hash of slot and seed) for the written slots.
absl::Status launch_synthetic_writes(const PoolView& pool, const KeyWrite* writes, int n_writes,
                                     uint32_t seed, cudaStream_t stream);

absl::Status launch_embed(const float* table, const int32_t* tokens, int rows, int d_model,
                          float* out, cudaStream_t stream);
// out[i] = rmsnorm(x[src_rows ? src_rows[i] : i]) * weight, for i < rows.
absl::Status launch_rmsnorm(const float* x, const int32_t* src_rows, const float* weight, int rows,
                            int d_model, float eps, float* out, cudaStream_t stream);
absl::Status launch_to_bf16(const float* x, int64_t n, void* out, cudaStream_t stream);
// out[r][i] = silu(gu[r][i]) * gu[r][d_ff + i].
absl::Status launch_swiglu(const float* gu, int rows, int d_ff, float* out, cudaStream_t stream);
// RoPE (rotate-half pairing) on the q and k parts of qkv, in place.
absl::Status launch_rope(float* qkv, int qkv_stride, int rows, int n_heads, int head_dim,
                         const int32_t* row_pos, float theta, cudaStream_t stream);

struct FieldArgs {
  const float* fl = nullptr;  // [rows][fl_stride]: field pre-activations | level offsets
  int fl_stride = 0;          // 0: no field (softmax): phi stays at phi_prev
  const float* field_b = nullptr;
  const float* level_b = nullptr;   // nullptr: tied levels
  bool fox = false;                 // d = logsigmoid(field)
  const float* phi_prev = nullptr;  // [items][n_heads]
  const int32_t* item_row0 = nullptr;
  const int32_t* item_len = nullptr;
  int items = 0;
  int n_heads = 0;
  float* phi = nullptr;  // outputs, [rows][n_heads]
  float* lvl = nullptr;
  float* cmin = nullptr;
  float* smin = nullptr;
};
// The walk per (item, head), summed sequentially in float32 like the CPU backend.
absl::Status launch_field(const FieldArgs& args, cudaStream_t stream);

}  // namespace fpa::cuda
