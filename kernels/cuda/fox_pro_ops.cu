// FoX Pro's kernels: the per-element work of fox_pro_ops.h spread over threads.
#include "kernels/cuda/fox_pro_ops.h"
#include "kernels/cuda/launch_check.h"

namespace fpa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per (row, head): the head's sum of squares is a warp reduction.
__global__ void head_norm_kernel(HeadNormArgs a) {
  const int pair = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= a.rows * a.n_heads) return;  // whole warps: blockDim is a multiple of 32
  const int row = pair / a.n_heads;
  const int head = pair % a.n_heads;
  const float ss = a.weight ? warp_sum(head_sum_squares(a, row, head, lane, 32)) : 0.0f;
  head_norm_apply(a, row, head, lane, 32, ss);
}

__global__ void shift_kernel(ShiftArgs a) {
  const int width = a.n_heads * a.head_dim;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(a.items) * 2 * width) return;
  shift_column(a, static_cast<int>(i / width / 2), static_cast<int>(i / width % 2),
               static_cast<int>(i % width));
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
