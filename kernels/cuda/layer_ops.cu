// The per-token kernels of a layer: embedding, RMSNorm, bf16 casts for cuBLAS, SwiGLU, RoPE and
// the field walk.
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/launch_check.h"

namespace fpa::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__global__ void embed_kernel(const float* table, const int32_t* tokens, int d_model, float* out) {
  const float* src = table + static_cast<size_t>(tokens[blockIdx.x]) * d_model;
  float* dst = out + static_cast<size_t>(blockIdx.x) * d_model;
  for (int i = threadIdx.x; i < d_model; i += blockDim.x) dst[i] = src[i];
}

// One block per row: the mean square is a block reduction.
__global__ void rmsnorm_kernel(const float* x, const int32_t* src_rows, const float* weight,
                               int d_model, float eps, float* out) {
  __shared__ float partial[kThreads];
  const int src = src_rows ? src_rows[blockIdx.x] : blockIdx.x;
  const float* in = x + static_cast<size_t>(src) * d_model;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d_model; i += blockDim.x) ss += in[i] * in[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / static_cast<float>(d_model) + eps);
  float* dst = out + static_cast<size_t>(blockIdx.x) * d_model;
  for (int i = threadIdx.x; i < d_model; i += blockDim.x) dst[i] = in[i] * inv * weight[i];
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(x[i]);
}

__global__ void swiglu_kernel(const float* gu, int rows, int d_ff, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * d_ff) return;
  const int64_t r = i / d_ff;
  const int64_t c = i % d_ff;
  const float g = gu[r * 2 * d_ff + c];
  out[i] = g / (1.0f + expf(-g)) * gu[r * 2 * d_ff + d_ff + c];
}

// Rotate-half pairing (i, i + head_dim / 2).
__global__ void rope_kernel(float* qkv, int qkv_stride, int rows, int n_heads, int head_dim,
                            const int32_t* row_pos, float theta) {
  const int half = head_dim / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Work items: (row, q or k, head, pair).
  if (i >= static_cast<int64_t>(rows) * 2 * n_heads * half) return;
  const int pair = static_cast<int>(i % half);
  const int head = static_cast<int>(i / half % n_heads);
  const int part = static_cast<int>(i / half / n_heads % 2);
  const int row = static_cast<int>(i / half / n_heads / 2);
  float* x = qkv + static_cast<size_t>(row) * qkv_stride +
             static_cast<size_t>(part) * n_heads * head_dim + head * head_dim;
  // float32 as the reference and the CPU backend compute it: pos * (1 / theta^(2i / head_dim)).
  const float inv_freq =
      1.0f / powf(theta, static_cast<float>(2 * pair) / static_cast<float>(head_dim));
  const float angle = static_cast<float>(row_pos[row]) * inv_freq;
  const float c = cosf(angle);
  const float s = sinf(angle);
  const float a = x[pair];
  const float b = x[pair + half];
  x[pair] = a * c - b * s;
  x[pair + half] = b * c + a * s;
}

__device__ __forceinline__ float log_sigmoid(float x) {
  return fminf(x, 0.0f) - log1pf(expf(-fabsf(x)));
}

// One thread per (item, head): the walk is a sequential float32 sum, like the CPU backend's.
__global__ void field_kernel(FieldArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.items * a.n_heads) return;
  const int item = i / a.n_heads;
  const int h = i % a.n_heads;
  const int row0 = a.item_row0[item];
  const int len = a.item_len[item];
  const int H = a.n_heads;
  float phi = a.phi_prev[i];
  float run_min = INFINITY;
  for (int r = row0; r < row0 + len; ++r) {
    if (a.fl_stride > 0) {
      float d = a.fl[static_cast<size_t>(r) * a.fl_stride + h] + a.field_b[h];
      if (a.fox) d = log_sigmoid(d);
      phi += d;
    }
    float lvl = phi;
    if (a.level_b) lvl = phi + (a.fl[static_cast<size_t>(r) * a.fl_stride + H + h] + a.level_b[h]);
    run_min = fminf(run_min, phi);
    a.phi[r * H + h] = phi;
    a.lvl[r * H + h] = lvl;
    a.cmin[r * H + h] = run_min;
  }
  float suffix = INFINITY;  // min phi over (r, last]
  for (int r = row0 + len - 1; r >= row0; --r) {
    a.smin[r * H + h] = suffix;
    suffix = fminf(suffix, a.phi[r * H + h]);
  }
}

}  // namespace

absl::Status launch_embed(const float* table, const int32_t* tokens, int rows, int d_model,
                          float* out, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  embed_kernel<<<rows, kThreads, 0, stream>>>(table, tokens, d_model, out);
  return launched("embed_kernel", stream);
}

absl::Status launch_rmsnorm(const float* x, const int32_t* src_rows, const float* weight, int rows,
                            int d_model, float eps, float* out, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  rmsnorm_kernel<<<rows, kThreads, 0, stream>>>(x, src_rows, weight, d_model, eps, out);
  return launched("rmsnorm_kernel", stream);
}

absl::Status launch_to_bf16(const float* x, int64_t n, void* out, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out));
  return launched("to_bf16_kernel", stream);
}

absl::Status launch_swiglu(const float* gu, int rows, int d_ff, float* out, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * d_ff;
  if (n == 0) return absl::OkStatus();
  swiglu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gu, rows, d_ff, out);
  return launched("swiglu_kernel", stream);
}

absl::Status launch_rope(float* qkv, int qkv_stride, int rows, int n_heads, int head_dim,
                         const int32_t* row_pos, float theta, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * 2 * n_heads * (head_dim / 2);
  if (n == 0) return absl::OkStatus();
  rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(qkv, qkv_stride, rows, n_heads, head_dim,
                                                      row_pos, theta);
  return launched("rope_kernel", stream);
}

absl::Status launch_field(const FieldArgs& args, cudaStream_t stream) {
  const int n = args.items * args.n_heads;
  if (n == 0) return absl::OkStatus();
  field_kernel<<<blocks_for(n), kThreads, 0, stream>>>(args);
  return launched("field_kernel", stream);
}

}  // namespace fpa::cuda
