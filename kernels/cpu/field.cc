#include "kernels/cpu/field.h"

#include "kernels/cpu/ops.h"

namespace fpa::cpu {

void field_walk(AttentionKind kind, const float* d_raw, const float* u, int n, int n_heads,
                int head, float phi0, float* phi, float* lvl) {
  float walk = phi0;
  for (int t = 0; t < n; ++t) {
    const long at = static_cast<long>(t) * n_heads + head;
    const float d = kind == AttentionKind::kFox ? log_sigmoid(d_raw[at]) : d_raw[at];
    walk += d;
    phi[t] = walk;
    lvl[t] = u != nullptr ? walk + u[at] : walk;
  }
}

}  // namespace fpa::cpu
