// Paged FPA attention (docs/fpa.md sections 1-4) and the page-pool updates.
//
// A warp computes one (row, head, split): its lanes take 32 keys at a time (one key each for the
// dot product and the penalty), fold them into an online softmax, and share the value rows: with
// 16-byte loads when the head allows it (each lane 8 consecutive dimensions, head_dim / 8 lanes a
// row, so the warp reads several rows at once and sums its lane groups at the end), else one
// dimension per lane. The row's own chunk keys are walked backwards from the diagonal in tiles
// of 32 with the three-part minimum of section 4: a within-tile suffix minimum (a warp scan), the
// minimum carried from the tiles already walked, and, for cached keys, the chunk's prefix minimum.
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/launch_check.h"
#include "kernels/cuda/prefill_tc.h"
#include "model/status_macros.h"

namespace fpa::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kMaxPerLane = kMaxHeadDim / kWarp;
constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_float(float x, float* out) { *out = x; }
__device__ __forceinline__ void from_float(float x, __nv_bfloat16* out) {
  *out = __float2bfloat16(x);
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

__device__ __forceinline__ float dot_row(const float* k, const float* q, int head_dim) {
  float s = 0.0f;
  for (int d = 0; d < head_dim; ++d) s += k[d] * q[d];
  return s;
}

// bf16 rows are read 16 bytes at a time when head_dim allows (rows are then 16-byte aligned).
__device__ __forceinline__ float dot_row(const __nv_bfloat16* k, const float* q, int head_dim) {
  float s = 0.0f;
  if (head_dim % 8 == 0) {
    const uint4* k8 = reinterpret_cast<const uint4*>(k);
    for (int c = 0; c < head_dim / 8; ++c) {
      const uint4 raw = k8[c];
      const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 f = __bfloat1622float2(pairs[p]);
        s += f.x * q[c * 8 + 2 * p] + f.y * q[c * 8 + 2 * p + 1];
      }
    }
    return s;
  }
  for (int d = 0; d < head_dim; ++d) s += __bfloat162float(k[d]) * q[d];
  return s;
}

// Online softmax state of one warp. With 16-byte value loads (kGrouped) lane owns dimensions
// 8 * (lane % G) .. + 8 of every G-th row (G = head_dim / 8), else dimensions lane, lane + 32, ...
struct Softmax {
  float max = -INFINITY;
  float sum = 0.0f;
  float acc[kMaxPerLane];
};
static_assert(kMaxPerLane == 8, "a grouped lane keeps 8 dimensions in acc");

// Whether 16-byte loads fit the head: 8 dimensions a lane, a row taking a power-of-two share of
// the warp (head_dim 8, 16, 32, 64, 128 or 256).
inline bool grouped_values(int head_dim) {
  return head_dim % 8 == 0 && kWarp % (head_dim / 8) == 0;
}

__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&f)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(pairs[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// acc += p_j * v_j over the tile's 32 keys (lane j offered p_j and v_j; p_j = 0: not live).
template <bool kGrouped, typename T>
__device__ void add_values(Softmax& st, float p, const T* v, int head_dim, int lane) {
  if constexpr (kGrouped) {
    const int group = head_dim / 8;  // lanes a row
    for (int j0 = 0; j0 < kWarp; j0 += kWarp / group) {
      const int j = j0 + lane / group;
      const float pj = __shfl_sync(kFull, p, j);
      const auto vj = reinterpret_cast<const T*>(
          __shfl_sync(kFull, reinterpret_cast<unsigned long long>(v), j));
      if (pj == 0.0f) continue;  // per lane group: the row is not live
      float f[8];
      load8(vj + (lane % group) * 8, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) st.acc[e] += pj * f[e];
    }
  } else {
    for (int j = 0; j < kWarp; ++j) {
      const float pj = __shfl_sync(kFull, p, j);
      const auto vj = reinterpret_cast<const T*>(
          __shfl_sync(kFull, reinterpret_cast<unsigned long long>(v), j));
      if (pj == 0.0f) continue;  // uniform: pj is the same on every lane
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int d = lane + e * kWarp;
        if (d < head_dim) st.acc[e] += pj * to_float(vj[d]);
      }
    }
  }
}

// Folds one tile: each lane offers one key with score `s` and value row `v` (when `live`).
template <bool kGrouped, typename T>
__device__ void fold_tile(Softmax& st, bool live, float s, const T* v, int head_dim, int lane) {
  const float tile_max = warp_max(live ? s : -INFINITY);
  if (tile_max == -INFINITY) return;  // uniform across the warp
  const float new_max = fmaxf(st.max, tile_max);
  const float scale = expf(st.max - new_max);  // 0 while st.max is -inf
  const float p = live ? expf(s - new_max) : 0.0f;
  st.sum = st.sum * scale + warp_sum(p);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) st.acc[e] *= scale;
  add_values<kGrouped>(st, p, v, head_dim, lane);
  st.max = new_max;
}

// Writes the warp's acc in dimension order; grouped lanes first sum their groups' partial rows.
template <bool kGrouped>
__device__ void store_acc(Softmax& st, float* out, int head_dim, int lane) {
  if constexpr (kGrouped) {
    const int group = head_dim / 8;
    for (int o = group; o < kWarp; o <<= 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) st.acc[e] += __shfl_xor_sync(kFull, st.acc[e], o);
    }
    if (lane < group) {
#pragma unroll
      for (int e = 0; e < 8; ++e) out[lane * 8 + e] = st.acc[e];
    }
  } else {
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + e * kWarp;
      if (d < head_dim) out[d] = st.acc[e];
    }
  }
}

struct Task {
  int row, head, split, item, head_dim, n_heads, qkv_stride;
  float beta, thr;
  const float* q;  // the warp's scaled query in shared memory
};

// The row's own chunk: keys at positions item_pos0 .. pos (rows item_row0 ..), walked backwards.
template <bool kGrouped>
__device__ void attend_chunk(const AttentionArgs& a, const Task& t, Softmax& st, int lane) {
  const int row0 = a.item_row0[t.item];
  const int attn_width = t.n_heads * t.head_dim;
  float carried = INFINITY;  // min phi over (j1, row]
  for (int j1 = t.row; j1 >= row0; j1 -= kWarp) {
    const int j = j1 - lane;
    bool live = j >= row0;
    const float x = live ? a.phi[j * t.n_heads + t.head] : INFINITY;
    float incl = x;  // min of x over lanes 0..lane, i.e. phi over [j, j1]
    for (int o = 1; o < kWarp; o <<= 1) {
      const float y = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl = fminf(incl, y);
    }
    float excl = __shfl_up_sync(kFull, incl, 1);  // phi over (j, j1]
    if (lane == 0) excl = INFINITY;
    float s = -INFINITY;
    const float* v = nullptr;
    if (live) {
      const float diff = a.lvl[j * t.n_heads + t.head] - fminf(excl, carried);
      live = !(diff >= t.thr);
      if (live) {
        const float* k =
            a.qkv + static_cast<size_t>(j) * t.qkv_stride + attn_width + t.head * t.head_dim;
        s = dot_row(k, t.q, t.head_dim) - t.beta * fmaxf(0.0f, diff);
        v = k + attn_width;
      }
    }
    fold_tile<kGrouped>(st, live, s, v, t.head_dim, lane);
    carried = fminf(carried, __shfl_sync(kFull, incl, kWarp - 1));
  }
}

// A cached key the threshold kills leaves the pool, counted for the host's check (decode_step.h).
__device__ __forceinline__ void retire(const AttentionArgs& a, const PoolView& pool, size_t slot) {
  pool.pos[slot] = -1;
  if (a.retired) atomicAdd(a.retired, 1);
}

// This split's share of the sequence's cached pages (as they were before this step).
template <bool kGrouped, typename T>
__device__ void attend_cached(const AttentionArgs& a, const PoolView& pool, const Task& t,
                              Softmax& st, int lane) {
  const int stream = t.item * t.n_heads + t.head;
  const int count = a.page_cnt[stream];
  const int per_split = (count + a.splits - 1) / a.splits;
  const int first = min(count, t.split * per_split) * pool.page_slots;
  const int end = min(count, (t.split + 1) * per_split) * pool.page_slots;
  const int32_t* table = a.page_ids + a.page_off[stream];
  const int pos0 = a.item_pos0[t.item];
  const float cmin = a.cmin[t.row * t.n_heads + t.head];  // phi over [pos0, row]
  const bool in_place = a.item_len[t.item] == 1;
  const T* keys = static_cast<const T*>(pool.k);
  const T* values = static_cast<const T*>(pool.v);
  for (int base = first; base < end; base += kWarp) {
    const int idx = base + lane;
    bool live = idx < end;
    float s = -INFINITY;
    const T* v = nullptr;
    if (live) {
      const size_t slot = static_cast<size_t>(table[idx / pool.page_slots]) * pool.page_slots +
                          idx % pool.page_slots;
      const int32_t pos = pool.pos[slot];
      live = pos >= 0 && pos < pos0;
      if (live) {
        const float m = fminf(pool.m[slot], cmin);
        const float diff = pool.lvl[slot] - m;
        live = !(diff >= t.thr);
        if (in_place) {  // the only reader of this slot in this step
          pool.m[slot] = m;
          if (!live) retire(a, pool, slot);
        }
        if (live) {
          s = dot_row(keys + slot * t.head_dim, t.q, t.head_dim) - t.beta * fmaxf(0.0f, diff);
          v = values + slot * t.head_dim;
        }
      }
    }
    fold_tile<kGrouped>(st, live, s, v, t.head_dim, lane);
  }
}

template <bool kGrouped, typename T>
__global__ void attention_kernel(AttentionArgs a, PoolView pool) {
  __shared__ float q_shared[kWarpsPerBlock][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int task = blockIdx.x * kWarpsPerBlock + warp;
  if (task >= a.rows * a.n_heads * a.splits) return;  // whole warps only
  Task t;
  t.split = task % a.splits;
  t.head = task / a.splits % a.n_heads;
  t.row = task / a.splits / a.n_heads;
  t.item = a.row_item[t.row];
  if (a.chunks_on_tensor_cores && a.item_len[t.item] > 1) return;  // prefill_tc.cu's rows
  t.head_dim = pool.head_dim;
  t.n_heads = a.n_heads;
  t.qkv_stride = a.qkv_stride;
  t.beta = a.beta[t.head];
  t.thr = a.thr[t.item * a.n_heads + t.head];
  const float scale = rsqrtf(static_cast<float>(t.head_dim));
  const float* q = a.qkv + static_cast<size_t>(t.row) * t.qkv_stride + t.head * t.head_dim;
  for (int d = lane; d < t.head_dim; d += kWarp) q_shared[warp][d] = q[d] * scale;
  __syncwarp();
  t.q = q_shared[warp];

  Softmax st;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) st.acc[e] = 0.0f;
  if (t.split == 0) attend_chunk<kGrouped>(a, t, st, lane);
  attend_cached<kGrouped, T>(a, pool, t, st, lane);

  float* out = a.partial + static_cast<size_t>(task) * (t.head_dim + 2);
  store_acc<kGrouped>(st, out, t.head_dim, lane);
  if (lane == 0) {
    out[t.head_dim] = st.max;
    out[t.head_dim + 1] = st.sum;
  }
}

// One warp per (row, head): merges the splits' partial softmax states.
__global__ void combine_kernel(AttentionArgs a, int head_dim) {
  const int lane = threadIdx.x % kWarp;
  const int rh = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (rh >= a.rows * a.n_heads) return;
  const size_t stride = head_dim + 2;
  const float* part = a.partial + static_cast<size_t>(rh) * a.splits * stride;
  float max = -INFINITY;
  for (int s = 0; s < a.splits; ++s) max = fmaxf(max, part[s * stride + head_dim]);
  float sum = 0.0f;
  for (int s = 0; s < a.splits; ++s) {
    const float m = part[s * stride + head_dim];
    if (m != -INFINITY) sum += part[s * stride + head_dim + 1] * expf(m - max);
  }
  const int row = rh / a.n_heads;
  const int head = rh % a.n_heads;
  if (a.chunks_on_tensor_cores && a.item_len[a.row_item[row]] > 1) return;
  float* out = a.out + static_cast<size_t>(row) * a.n_heads * head_dim + head * head_dim;
  for (int d = lane; d < head_dim; d += kWarp) {
    float acc = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const float m = part[s * stride + head_dim];
      if (m != -INFINITY) acc += part[s * stride + d] * expf(m - max);
    }
    out[d] = acc / sum;
  }
}

// Prompt chunks: after attention, the cached keys see the chunk's minimum phi (one block per
// (item, head)); keys it kills are marked free, as evict_for_chunk frees them on the host.
__global__ void commit_chunk_kernel(AttentionArgs a, PoolView pool) {
  const int item = blockIdx.x / a.n_heads;
  const int head = blockIdx.x % a.n_heads;
  const int len = a.item_len[item];
  if (len == 1) return;  // done in place by the attention kernel
  const int stream = item * a.n_heads + head;
  const int last_row = a.item_row0[item] + len - 1;
  const float chunk_min = a.cmin[last_row * a.n_heads + head];
  const float thr = a.thr[stream];
  const int pos0 = a.item_pos0[item];
  const int32_t* table = a.page_ids + a.page_off[stream];
  const int n = a.page_cnt[stream] * pool.page_slots;
  for (int idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const size_t slot =
        static_cast<size_t>(table[idx / pool.page_slots]) * pool.page_slots + idx % pool.page_slots;
    const int32_t pos = pool.pos[slot];
    if (pos < 0 || pos >= pos0) continue;
    const float m = fminf(pool.m[slot], chunk_min);
    pool.m[slot] = m;
    if (pool.lvl[slot] - m >= thr) retire(a, pool, slot);
  }
}

template <typename T>
absl::Status launch_attention_typed(const AttentionArgs& args, const PoolView& pool,
                                    cudaStream_t stream) {
  AttentionArgs a = args;
  a.chunks_on_tensor_cores = a.n_tc_tiles > 0 && prefill_tc_fits(pool);
  const int threads = kWarpsPerBlock * kWarp;
  const int tasks = a.rows * a.n_heads * a.splits;
  const int blocks = (tasks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (grouped_values(pool.head_dim)) {
    attention_kernel<true, T><<<blocks, threads, 0, stream>>>(a, pool);
  } else {
    attention_kernel<false, T><<<blocks, threads, 0, stream>>>(a, pool);
  }
  FPA_RETURN_IF_ERROR(launched("attention_kernel", stream));
  if (a.chunks_on_tensor_cores) FPA_RETURN_IF_ERROR(launch_prefill_tc(a, pool, stream));
  const int pairs = a.rows * a.n_heads;
  combine_kernel<<<(pairs + kWarpsPerBlock - 1) / kWarpsPerBlock, threads, 0, stream>>>(
      a, pool.head_dim);
  FPA_RETURN_IF_ERROR(launched("combine_kernel", stream));
  commit_chunk_kernel<<<a.items * a.n_heads, 256, 0, stream>>>(a, pool);
  return launched("commit_chunk_kernel", stream);
}

// Resets, then writes, then moves: each a separate launch so that stream order sequences them.
__global__ void reset_pages_kernel(PoolView pool, const int32_t* pages, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * pool.page_slots) return;
  pool.pos[static_cast<size_t>(pages[i / pool.page_slots]) * pool.page_slots +
           i % pool.page_slots] = -1;
}

template <typename T>
__global__ void write_keys_kernel(PoolView pool, const KeyWrite* writes, const float* qkv,
                                  int qkv_stride, int n_heads) {
  const KeyWrite w = writes[blockIdx.x];
  const int attn_width = n_heads * pool.head_dim;
  const float* k =
      qkv + static_cast<size_t>(w.row) * qkv_stride + attn_width + w.head * pool.head_dim;
  const float* v = k + attn_width;
  T* kd = static_cast<T*>(pool.k) + static_cast<size_t>(w.slot_index) * pool.head_dim;
  T* vd = static_cast<T*>(pool.v) + static_cast<size_t>(w.slot_index) * pool.head_dim;
  for (int d = threadIdx.x; d < pool.head_dim; d += blockDim.x) {
    from_float(k[d], kd + d);
    from_float(v[d], vd + d);
  }
  if (threadIdx.x == 0) {
    pool.lvl[w.slot_index] = w.lvl;
    pool.m[w.slot_index] = w.m;
    pool.pos[w.slot_index] = w.pos;
  }
}

// Moves depend on each other (a slot freed by one may be filled by the next): one block, in order.
template <typename T>
__global__ void move_slots_kernel(PoolView pool, const SlotMove* moves, int n) {
  T* k = static_cast<T*>(pool.k);
  T* v = static_cast<T*>(pool.v);
  for (int i = 0; i < n; ++i) {
    const size_t from = moves[i].from;
    const size_t to = moves[i].to;
    for (int d = threadIdx.x; d < pool.head_dim; d += blockDim.x) {
      k[to * pool.head_dim + d] = k[from * pool.head_dim + d];
      v[to * pool.head_dim + d] = v[from * pool.head_dim + d];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      pool.lvl[to] = pool.lvl[from];
      pool.m[to] = pool.m[from];
      pool.pos[to] = pool.pos[from];
      pool.pos[from] = -1;
    }
    __syncthreads();
  }
}

// A fork's copies land in pages of its own, never a source: one block a copy, in any order.
template <typename T>
__global__ void copy_slots_kernel(PoolView pool, const SlotCopy* copies) {
  const SlotCopy c = copies[blockIdx.x];
  const T* k = static_cast<const T*>(pool.k);
  const T* v = static_cast<const T*>(pool.v);
  T* kd = static_cast<T*>(pool.k);
  T* vd = static_cast<T*>(pool.v);
  const size_t from = static_cast<size_t>(c.from) * pool.head_dim;
  const size_t to = static_cast<size_t>(c.to) * pool.head_dim;
  for (int d = threadIdx.x; d < pool.head_dim; d += blockDim.x) {
    kd[to + d] = k[from + d];
    vd[to + d] = v[from + d];
  }
  if (threadIdx.x == 0) {
    pool.lvl[c.to] = pool.lvl[c.from];
    pool.m[c.to] = pool.m[c.from];
    pool.pos[c.to] = pool.pos[c.from];
  }
}

template <typename T>
absl::Status launch_pool_update_typed(const PoolView& pool, const int32_t* reset_pages,
                                      int n_resets, const KeyWrite* writes, int n_writes,
                                      const SlotMove* moves, int n_moves, const float* qkv,
                                      int qkv_stride, int n_heads, cudaStream_t stream) {
  if (n_resets > 0) {
    const int n = n_resets * pool.page_slots;
    reset_pages_kernel<<<(n + 255) / 256, 256, 0, stream>>>(pool, reset_pages, n_resets);
    FPA_RETURN_IF_ERROR(launched("reset_pages_kernel", stream));
  }
  if (n_writes > 0) {
    write_keys_kernel<T><<<n_writes, 64, 0, stream>>>(pool, writes, qkv, qkv_stride, n_heads);
    FPA_RETURN_IF_ERROR(launched("write_keys_kernel", stream));
  }
  if (n_moves > 0) {
    move_slots_kernel<T><<<1, 128, 0, stream>>>(pool, moves, n_moves);
    FPA_RETURN_IF_ERROR(launched("move_slots_kernel", stream));
  }
  return absl::OkStatus();
}

__device__ __forceinline__ float hash_uniform(uint32_t x) {  // in [-1, 1)
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T>
__global__ void synthetic_writes_kernel(PoolView pool, const KeyWrite* writes, uint32_t seed) {
  const KeyWrite w = writes[blockIdx.x];
  T* k = static_cast<T*>(pool.k) + static_cast<size_t>(w.slot_index) * pool.head_dim;
  T* v = static_cast<T*>(pool.v) + static_cast<size_t>(w.slot_index) * pool.head_dim;
  for (int d = threadIdx.x; d < pool.head_dim; d += blockDim.x) {
    const uint32_t key = seed ^ (static_cast<uint32_t>(w.slot_index) * 2654435761u) ^
                         static_cast<uint32_t>(d) * 40503u;
    from_float(hash_uniform(key), k + d);
    from_float(hash_uniform(key ^ 0x5bd1e995u), v + d);
  }
  if (threadIdx.x == 0) {
    pool.lvl[w.slot_index] = w.lvl;
    pool.m[w.slot_index] = w.m;
    pool.pos[w.slot_index] = w.pos;
  }
}

__global__ void gather_pos_kernel(PoolView pool, const int32_t* pages, int n, int32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * pool.page_slots) return;
  out[i] = pool.pos[static_cast<size_t>(pages[i / pool.page_slots]) * pool.page_slots +
                    i % pool.page_slots];
}

}  // namespace

absl::Status launch_attention(const AttentionArgs& args, const PoolView& pool,
                              cudaStream_t stream) {
  if (args.rows == 0) return absl::OkStatus();
  return pool.type == KvType::kBf16 ? launch_attention_typed<__nv_bfloat16>(args, pool, stream)
                                    : launch_attention_typed<float>(args, pool, stream);
}

absl::Status launch_pool_update(const PoolView& pool, const int32_t* reset_pages, int n_resets,
                                const KeyWrite* writes, int n_writes, const SlotMove* moves,
                                int n_moves, const float* qkv, int qkv_stride, int n_heads,
                                cudaStream_t stream) {
  return pool.type == KvType::kBf16
             ? launch_pool_update_typed<__nv_bfloat16>(pool, reset_pages, n_resets, writes,
                                                       n_writes, moves, n_moves, qkv, qkv_stride,
                                                       n_heads, stream)
             : launch_pool_update_typed<float>(pool, reset_pages, n_resets, writes, n_writes, moves,
                                               n_moves, qkv, qkv_stride, n_heads, stream);
}

absl::Status launch_slot_copies(const PoolView& pool, const int32_t* reset_pages, int n_resets,
                                const SlotCopy* copies, int n_copies, cudaStream_t stream) {
  if (n_resets > 0) {
    const int n = n_resets * pool.page_slots;
    reset_pages_kernel<<<(n + 255) / 256, 256, 0, stream>>>(pool, reset_pages, n_resets);
    FPA_RETURN_IF_ERROR(launched("reset_pages_kernel", stream));
  }
  if (n_copies == 0) return absl::OkStatus();
  if (pool.type == KvType::kBf16) {
    copy_slots_kernel<__nv_bfloat16><<<n_copies, 64, 0, stream>>>(pool, copies);
  } else {
    copy_slots_kernel<float><<<n_copies, 64, 0, stream>>>(pool, copies);
  }
  return launched("copy_slots_kernel", stream);
}

absl::Status launch_gather_pos(const PoolView& pool, const int32_t* pages, int n_pages,
                               int32_t* out, cudaStream_t stream) {
  const int n = n_pages * pool.page_slots;
  if (n == 0) return absl::OkStatus();
  gather_pos_kernel<<<(n + 255) / 256, 256, 0, stream>>>(pool, pages, n_pages, out);
  return launched("gather_pos_kernel", stream);
}

absl::Status launch_synthetic_writes(const PoolView& pool, const KeyWrite* writes, int n_writes,
                                     uint32_t seed, cudaStream_t stream) {
  if (n_writes == 0) return absl::OkStatus();
  if (pool.type == KvType::kBf16) {
    synthetic_writes_kernel<__nv_bfloat16><<<n_writes, 64, 0, stream>>>(pool, writes, seed);
  } else {
    synthetic_writes_kernel<float><<<n_writes, 64, 0, stream>>>(pool, writes, seed);
  }
  return launched("synthetic_writes_kernel", stream);
}

}  // namespace fpa::cuda
