// Prompt-chunk attention on tensor cores (docs/fpa.md sections 1-4): one warp per (16-row query
// tile of a chunk, head) walks the sequence's cached pages, then its own chunk's keys backwards
// from the diagonal, 16 keys a tile. Scores and the value sums are bf16 WMMA products (16x16x16)
// accumulated in float32; the FPA penalty, the exclusion at the threshold and the online softmax
// are float32 per element, with the three-part minimum of section 4: for a chunk key j and a row
// i, min phi over (j, i] = min(over (j, end of j's tile], over the tiles between, over [start of
// i's tile, i]). Rows and keys are read once per tile pair instead of once per row: the warp
// kernel (attention.cu) re-reads every cached key for every row of a chunk.
//
// Only bf16 pools with head_dim a multiple of 16 up to 128 take this path (prefill_tc_fits):
// the query and the probabilities are rounded to bf16 for the products, which a float32 pool,
// kept for bit-exact parity, must not be.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

#include "kernels/cuda/launch_check.h"
#include "kernels/cuda/prefill_tc.h"

namespace fpa::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = kChunkTile;
constexpr int kMaxDim = 128;
constexpr unsigned kFull = 0xffffffffu;

struct __align__(128) Smem {        // every WMMA operand at a multiple of 32 bytes
  __nv_bfloat16 q[kTile][kMaxDim];  // the scaled query rows
  __nv_bfloat16 k[kTile][kMaxDim];  // the key tile, key-major
  __nv_bfloat16 v[kTile][kMaxDim];
  __nv_bfloat16 p[kTile][kTile];         // probabilities of the tile
  float s[kTile][kTile];                 // scores, then one 16-column block of P V
  float o[kTile][kMaxDim];               // the rows' running value sums
  float key_lvl[kTile], key_min[kTile];  // cached: lvl and m; chunk: lvl and min phi to tile end
  int key_ok[kTile];                     // a key that exists and may be attended (not yet causal)
  float row_max[kTile], row_sum[kTile], row_alpha[kTile];
  float row_cmin[kTile];  // phi over [pos0, row]: what a cached key's m meets
  float row_pfx[kTile];   // phi over [first row of the tile, row]
};

struct Tile {
  int r0, rows, item, row0, len, pos0, head, head_dim, n_heads;
  float beta, thr;
};

// S = Q K^T for the tile (Q already scaled).
__device__ void scores(Smem& sm, int head_dim) {
  wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int d = 0; d < head_dim; d += kTile) {
    wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __nv_bfloat16, wmma::col_major> b;
    wmma::load_matrix_sync(a, &sm.q[0][d], kMaxDim);
    wmma::load_matrix_sync(b, &sm.k[0][d], kMaxDim);  // K^T: column j of B is key j
    wmma::mma_sync(acc, a, b, acc);
  }
  wmma::store_matrix_sync(&sm.s[0][0], acc, kTile, wmma::mem_row_major);
  __syncwarp();
}

// The online softmax over one tile of penalised scores in sm.s (-inf: excluded), then
// O = O * alpha + P V.
__device__ void fold(Smem& sm, int head_dim, int lane) {
  if (lane < kTile) {
    float tile_max = -INFINITY;
    for (int j = 0; j < kTile; ++j) tile_max = fmaxf(tile_max, sm.s[lane][j]);
    const float new_max = fmaxf(sm.row_max[lane], tile_max);
    float sum = 0.0f;
    for (int j = 0; j < kTile; ++j) {
      const float p = new_max == -INFINITY ? 0.0f : expf(sm.s[lane][j] - new_max);
      sm.p[lane][j] = __float2bfloat16(p);
      sum += p;
    }
    const float alpha = new_max == -INFINITY ? 1.0f : expf(sm.row_max[lane] - new_max);
    sm.row_alpha[lane] = alpha;
    sm.row_sum[lane] = sm.row_sum[lane] * alpha + sum;
    sm.row_max[lane] = new_max;
  }
  __syncwarp();
  wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, &sm.p[0][0], kTile);
  for (int c = 0; c < head_dim; c += kTile) {
    wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __nv_bfloat16, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(b, &sm.v[0][c], kMaxDim);
    wmma::mma_sync(acc, a, b, acc);
    wmma::store_matrix_sync(&sm.s[0][0], acc, kTile, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < kTile * kTile; e += 32) {
      const int i = e / kTile, d = c + e % kTile;
      sm.o[i][d] = sm.o[i][d] * sm.row_alpha[i] + sm.s[i][e % kTile];
    }
    __syncwarp();
  }
}

// One cached page's worth of keys (16 slot indices from idx): K, V and their lvl and m.
__device__ bool load_cached(Smem& sm, const AttentionArgs& a, const PoolView& pool, const Tile& t,
                            const int32_t* table, int idx, int end, int lane) {
  if (lane < kTile) {
    const int i = idx + lane;
    int ok = 0;
    if (i < end) {
      const size_t slot =
          static_cast<size_t>(table[i / pool.page_slots]) * pool.page_slots + i % pool.page_slots;
      const int32_t pos = pool.pos[slot];
      ok = pos >= 0 && pos < t.pos0;
      sm.key_lvl[lane] = ok ? pool.lvl[slot] : 0.0f;
      sm.key_min[lane] = ok ? pool.m[slot] : 0.0f;
    }
    sm.key_ok[lane] = ok;
  }
  __syncwarp();
  if (!__any_sync(kFull, lane < kTile && sm.key_ok[lane])) return false;
  const auto* keys = static_cast<const __nv_bfloat16*>(pool.k);
  const auto* values = static_cast<const __nv_bfloat16*>(pool.v);
  for (int e = lane; e < kTile * t.head_dim; e += 32) {
    const int j = e / t.head_dim, d = e % t.head_dim;
    const int i = idx + j;
    __nv_bfloat16 kv = __float2bfloat16(0.0f), vv = kv;
    if (sm.key_ok[j]) {
      const size_t slot =
          static_cast<size_t>(table[i / pool.page_slots]) * pool.page_slots + i % pool.page_slots;
      kv = keys[slot * t.head_dim + d];
      vv = values[slot * t.head_dim + d];
    }
    sm.k[j][d] = kv;
    sm.v[j][d] = vv;
  }
  __syncwarp();
  return true;
}

// Penalised scores of a cached tile: lvl - min(m, phi over [pos0, row]), excluded at thr.
__device__ void penalise_cached(Smem& sm, const Tile& t, int lane) {
  for (int e = lane; e < kTile * kTile; e += 32) {
    const int i = e / kTile, j = e % kTile;
    float s = -INFINITY;
    if (i < t.rows && sm.key_ok[j]) {
      const float diff = sm.key_lvl[j] - fminf(sm.key_min[j], sm.row_cmin[i]);
      if (!(diff >= t.thr)) s = sm.s[i][j] - t.beta * fmaxf(0.0f, diff);
    }
    sm.s[i][j] = s;
  }
  __syncwarp();
}

__device__ void attend_cached(Smem& sm, const AttentionArgs& a, const PoolView& pool, const Tile& t,
                              int lane) {
  const int stream = t.item * t.n_heads + t.head;
  const int32_t* table = a.page_ids + a.page_off[stream];
  const int end = a.page_cnt[stream] * pool.page_slots;
  for (int idx = 0; idx < end; idx += kTile) {
    if (!load_cached(sm, a, pool, t, table, idx, end, lane)) continue;
    scores(sm, t.head_dim);
    penalise_cached(sm, t, lane);
    fold(sm, t.head_dim, lane);
  }
}

// The chunk's keys j0 .. j0 + 15 (rows of qkv): K, V, lvl, and min phi over (j, j0 + 15].
__device__ void load_chunk(Smem& sm, const AttentionArgs& a, const Tile& t, int j0, int lane) {
  const int attn_width = t.n_heads * t.head_dim;
  if (lane < kTile) {
    const int j = j0 + lane;
    const int ok = j >= t.row0 && j < t.row0 + t.len;
    float after = INFINITY;
    for (int u = j + 1; u < j0 + kTile && u < t.row0 + t.len; ++u) {
      after = fminf(after, a.phi[u * t.n_heads + t.head]);
    }
    sm.key_ok[lane] = ok;
    sm.key_lvl[lane] = ok ? a.lvl[j * t.n_heads + t.head] : 0.0f;
    sm.key_min[lane] = after;
  }
  __syncwarp();
  for (int e = lane; e < kTile * t.head_dim; e += 32) {
    const int jj = e / t.head_dim, d = e % t.head_dim;
    const int j = j0 + jj;
    const bool ok = sm.key_ok[jj];
    const float* k = a.qkv + static_cast<size_t>(ok ? j : t.r0) * a.qkv_stride + attn_width +
                     t.head * t.head_dim;
    sm.k[jj][d] = __float2bfloat16(ok ? k[d] : 0.0f);
    sm.v[jj][d] = __float2bfloat16(ok ? k[attn_width + d] : 0.0f);
  }
  __syncwarp();
}

// Penalised scores of a chunk tile against rows r0 + i: causal, with min phi over (j, row] from
// the key's own tile, the tiles between (`between`) and the row's tile; on the diagonal tile the
// minimum is taken directly.
__device__ void penalise_chunk(Smem& sm, const AttentionArgs& a, const Tile& t, int j0,
                               float between, int lane) {
  for (int e = lane; e < kTile * kTile; e += 32) {
    const int i = e / kTile, jj = e % kTile;
    const int row = t.r0 + i, j = j0 + jj;
    float s = -INFINITY;
    if (i < t.rows && sm.key_ok[jj] && j <= row) {
      float low = INFINITY;
      if (j0 == t.r0) {
        for (int u = j + 1; u <= row; ++u) low = fminf(low, a.phi[u * t.n_heads + t.head]);
      } else {
        low = fminf(fminf(sm.key_min[jj], between), sm.row_pfx[i]);
      }
      const float diff = sm.key_lvl[jj] - low;
      if (!(diff >= t.thr)) s = sm.s[i][jj] - t.beta * fmaxf(0.0f, diff);
    }
    sm.s[i][jj] = s;
  }
  __syncwarp();
}

__device__ void attend_chunk(Smem& sm, const AttentionArgs& a, const Tile& t, int lane) {
  float between = INFINITY;  // phi over [end of the current key tile + 1, r0 - 1]
  for (int j0 = t.r0; j0 + kTile > t.row0; j0 -= kTile) {
    load_chunk(sm, a, t, j0, lane);
    scores(sm, t.head_dim);
    penalise_chunk(sm, a, t, j0, between, lane);
    fold(sm, t.head_dim, lane);
    if (j0 != t.r0) {
      for (int u = max(j0, t.row0); u < j0 + kTile; ++u) {
        between = fminf(between, a.phi[u * t.n_heads + t.head]);
      }
    } else {
      between = INFINITY;  // the tile before the diagonal meets the query tile directly
    }
  }
}

__device__ void start_tile(Smem& sm, const AttentionArgs& a, const Tile& t, int lane) {
  const float scale = rsqrtf(static_cast<float>(t.head_dim));
  for (int e = lane; e < kTile * t.head_dim; e += 32) {
    const int i = e / t.head_dim, d = e % t.head_dim;
    const float q =
        i < t.rows ? a.qkv[static_cast<size_t>(t.r0 + i) * a.qkv_stride + t.head * t.head_dim + d]
                   : 0.0f;
    sm.q[i][d] = __float2bfloat16(q * scale);
    sm.o[i][d] = 0.0f;
  }
  if (lane < kTile) {
    const int row = t.r0 + min(lane, t.rows - 1);
    sm.row_max[lane] = -INFINITY;
    sm.row_sum[lane] = 0.0f;
    sm.row_cmin[lane] = a.cmin[row * t.n_heads + t.head];
    float pfx = INFINITY;
    for (int u = t.r0; u <= row; ++u) pfx = fminf(pfx, a.phi[u * t.n_heads + t.head]);
    sm.row_pfx[lane] = pfx;
  }
  __syncwarp();
}

__global__ void prefill_tc_kernel(AttentionArgs a, PoolView pool) {
  __shared__ Smem sm;
  const int lane = threadIdx.x;
  Tile t;
  t.head = blockIdx.x % a.n_heads;
  t.r0 = a.tc_tiles[blockIdx.x / a.n_heads];
  t.item = a.row_item[t.r0];
  t.row0 = a.item_row0[t.item];
  t.len = a.item_len[t.item];
  t.rows = min(kTile, t.row0 + t.len - t.r0);
  t.pos0 = a.item_pos0[t.item];
  t.head_dim = pool.head_dim;
  t.n_heads = a.n_heads;
  t.beta = a.beta[t.head];
  t.thr = a.thr[t.item * a.n_heads + t.head];
  start_tile(sm, a, t, lane);
  attend_cached(sm, a, pool, t, lane);
  attend_chunk(sm, a, t, lane);
  for (int e = lane; e < t.rows * t.head_dim; e += 32) {
    const int i = e / t.head_dim, d = e % t.head_dim;
    a.out[static_cast<size_t>(t.r0 + i) * t.n_heads * t.head_dim + t.head * t.head_dim + d] =
        sm.o[i][d] / sm.row_sum[i];
  }
}

}  // namespace

bool prefill_tc_fits(const PoolView& pool) {
  return pool.type == KvType::kBf16 && pool.head_dim % kTile == 0 && pool.head_dim <= kMaxDim;
}

absl::Status launch_prefill_tc(const AttentionArgs& a, const PoolView& pool, cudaStream_t stream) {
  if (a.n_tc_tiles == 0) return absl::OkStatus();
  prefill_tc_kernel<<<a.n_tc_tiles * a.n_heads, 32, 0, stream>>>(a, pool);
  return launched("prefill_tc_kernel", stream);
}

}  // namespace fpa::cuda
