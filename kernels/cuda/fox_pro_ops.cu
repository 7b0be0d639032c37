// FoX Pro's per-token kernels: the key / value shift, and the per-head RMSNorm with the output
// gate (QK-norm, output norm). float32 throughout, in the CPU backend's order of operations.
#include <cmath>

#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/launch_check.h"

namespace fpa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per (row, head): the head's mean square is a warp reduction.
__global__ void head_norm_kernel(HeadNormArgs a) {
  const int pair = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= a.rows * a.n_heads) return;  // whole warps: blockDim is a multiple of 32
  const int row = pair / a.n_heads;
  const int head = pair % a.n_heads;
  float* x = a.x + static_cast<size_t>(row) * a.x_stride + head * a.head_dim;
  float inv = 1.0f;
  if (a.weight) {
    float ss = 0.0f;
    for (int i = lane; i < a.head_dim; i += 32) ss += x[i] * x[i];
    inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(a.head_dim) + a.eps);
  }
  const float* w = a.weight ? a.weight + head * a.weight_head_stride : nullptr;
  const float* gate =
      a.gate ? a.gate + static_cast<size_t>(row) * a.gate_stride + head * a.head_dim : nullptr;
  for (int i = lane; i < a.head_dim; i += 32) {
    float v = x[i];
    if (w) v = v * inv * w[i];
    if (gate) {
      const float g = gate[i];
      v *= a.gate_silu ? g * sigmoid(g) : sigmoid(g);
    }
    x[i] = v;
  }
}

// One thread per (item, k or v, column): the item's rows are walked backwards, so that row t - 1
// still holds the projection when row t reads it, as the CPU backend does.
__global__ void shift_kernel(ShiftArgs a) {
  const int width = a.n_heads * a.head_dim;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(a.items) * 2 * width) return;
  const int e = static_cast<int>(i % width);
  const int which = static_cast<int>(i / width % 2);  // 0: k, 1: v
  const int item = static_cast<int>(i / width / 2);
  const int col = which ? a.v_gate_col : a.k_gate_col;
  if (col < 0) return;
  const int head = e / a.head_dim;
  const int row0 = a.item_row0[item];
  const int len = a.item_len[item];
  float* y = a.qkv + static_cast<size_t>(1 + which) * width + e;
  float* state =
      a.state +
      ((static_cast<size_t>(a.item_slot[item]) * a.n_layers + a.layer) * 2 + which) * width + e;
  const float last = y[static_cast<size_t>(row0 + len - 1) * a.qkv_stride];
  for (int r = row0 + len - 1; r >= row0; --r) {
    float* cur = y + static_cast<size_t>(r) * a.qkv_stride;
    const float prev = r > row0 ? cur[-a.qkv_stride] : *state;
    const float alpha = sigmoid(a.gates[static_cast<size_t>(r) * a.gate_stride + col + head]);
    *cur = alpha * prev + (1.0f - alpha) * *cur;
  }
  *state = last;
}

}  // namespace

absl::Status launch_head_norm(const HeadNormArgs& args, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(args.rows) * args.n_heads;
  if (pairs == 0) return absl::OkStatus();
  const int blocks = static_cast<int>((pairs + kWarpsPerBlock - 1) / kWarpsPerBlock);
  head_norm_kernel<<<blocks, kThreads, 0, stream>>>(args);
  return launched("head_norm_kernel", stream);
}

absl::Status launch_shift(const ShiftArgs& args, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(args.items) * 2 * args.n_heads * args.head_dim;
  if (n == 0) return absl::OkStatus();
  shift_kernel<<<blocks_for(n), kThreads, 0, stream>>>(args);
  return launched("shift_kernel", stream);
}

}  // namespace fpa::cuda
