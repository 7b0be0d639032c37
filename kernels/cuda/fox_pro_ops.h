// FoX Pro's kernels (fox_pro_ops.cu): the key / value shift, and the per-head RMSNorm with the
// output gate (QK-norm, output norm). Their per-element work is written here as functions the
// host can call too, so that tests without a device hold it to the CPU backend's; the kernels
// only spread it over threads. float32 throughout, in the CPU backend's order of operations.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"

#if defined(__CUDACC__)
#define FPA_HOST_DEVICE __host__ __device__
#else
#define FPA_HOST_DEVICE
#endif

namespace fpa::cuda {

// In place on x [rows][x_stride] (head h at h * head_dim): each head's slice RMS-normed (unless
// weight is null) with weight [n_heads * head_dim] (weight_head_stride head_dim) or one
// [head_dim] scale shared by every head (weight_head_stride 0), then times act(gate) (unless gate
// is null; gate [rows][gate_stride], head h at h * head_dim; act silu or sigmoid). QK-norm on q
// and on k; the output norm and gate on the attention output.
struct HeadNormArgs {
  float* x = nullptr;
  int x_stride = 0;
  int rows = 0;
  int n_heads = 0;
  int head_dim = 0;
  const float* weight = nullptr;
  int weight_head_stride = 0;
  float eps = 0.0f;
  const float* gate = nullptr;
  int gate_stride = 0;
  bool gate_silu = false;
};
// One warp per (row, head).
absl::Status launch_head_norm(const HeadNormArgs& args, cudaStream_t stream);

// The key / value shift (shift_slots.h), in place on the k and v parts of qkv: row t of each
// item becomes a_t y_{t-1} + (1 - a_t) y_t per head, a = sigmoid(gate pre-activation), y_{-1} the
// item's slot row of this layer; that row then becomes the item's last unshifted row.
struct ShiftArgs {
  float* qkv = nullptr;  // [rows][qkv_stride]: q | k | v, head h at h * head_dim
  int qkv_stride = 0;
  const float* gates = nullptr;  // [rows][gate_stride]: the fused field row (projection_layout.h)
  int gate_stride = 0;
  int k_gate_col = -1;  // -1: that part is not shifted
  int v_gate_col = -1;
  const int32_t* item_row0 = nullptr;
  const int32_t* item_len = nullptr;
  const int32_t* item_slot = nullptr;
  float* state = nullptr;  // [slots][n_layers][2: k, v][n_heads * head_dim]
  int layer = 0;
  int n_layers = 0;
  int items = 0;
  int n_heads = 0;
  int head_dim = 0;
};
// One thread per (item, k or v, column).
absl::Status launch_shift(const ShiftArgs& args, cudaStream_t stream);

FPA_HOST_DEVICE inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// One column e of part `which` (0: k, 1: v) of one item, its rows walked backwards so that row
// t - 1 still holds the projection when row t reads it, as the CPU backend does.
FPA_HOST_DEVICE inline void shift_column(const ShiftArgs& a, int item, int which, int e) {
  const int col = which ? a.v_gate_col : a.k_gate_col;
  if (col < 0) return;
  const int width = a.n_heads * a.head_dim;
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
    const float prev = r > row0 ? *(cur - a.qkv_stride) : *state;
    const float alpha = sigmoid(a.gates[static_cast<size_t>(r) * a.gate_stride + col + head]);
    *cur = alpha * prev + (1.0f - alpha) * *cur;
  }
  *state = last;
}

// Where head `head` of row `row` starts in x.
FPA_HOST_DEVICE inline float* head_slice(const HeadNormArgs& a, int row, int head) {
  return a.x + static_cast<size_t>(row) * a.x_stride + head * a.head_dim;
}

// Lane `lane` of `lanes` takes every lanes-th element of the head from `lane` on: its part of the
// head's sum of squares (the kernel sums the lanes' parts), ...
FPA_HOST_DEVICE inline float head_sum_squares(const HeadNormArgs& a, int row, int head, int lane,
                                              int lanes) {
  const float* x = head_slice(a, row, head);
  float ss = 0.0f;
  for (int i = lane; i < a.head_dim; i += lanes) ss += x[i] * x[i];
  return ss;
}

// ... then its elements normed with the head's whole sum of squares, then gated.
FPA_HOST_DEVICE inline void head_norm_apply(const HeadNormArgs& a, int row, int head, int lane,
                                            int lanes, float sum_squares) {
  float* x = head_slice(a, row, head);
  const float* w = a.weight ? a.weight + head * a.weight_head_stride : nullptr;
  const float inv = w ? 1.0f / sqrtf(sum_squares / static_cast<float>(a.head_dim) + a.eps) : 1.0f;
  const float* gate =
      a.gate ? a.gate + static_cast<size_t>(row) * a.gate_stride + head * a.head_dim : nullptr;
  for (int i = lane; i < a.head_dim; i += lanes) {
    float v = x[i];
    if (w) v = v * inv * w[i];
    if (gate) v *= a.gate_silu ? gate[i] * sigmoid(gate[i]) : sigmoid(gate[i]);
    x[i] = v;
  }
}

}  // namespace fpa::cuda
