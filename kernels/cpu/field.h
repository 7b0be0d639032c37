// The FPA field and levels (docs/fpa.md section 1) for the tokens of one head.
#pragma once

#include "model/model.h"

namespace fpa::cpu {

// d_raw and u are [n, n_heads] rows (u null for tied levels); reads column `head`.
// phi_t = phi_{t-1} + d_t (phi_{-1} = phi0, float32 walk), d = logsigmoid(d_raw) for fox;
// lvl_t = phi_t + u_t, or phi_t when tied. Writes phi[0..n) and lvl[0..n).
void field_walk(AttentionKind kind, const float* d_raw, const float* u, int n, int n_heads,
                int head, float phi0, float* phi, float* lvl);

}  // namespace fpa::cpu
