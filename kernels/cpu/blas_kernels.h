// OpenBLAS picks its kernels once, as it loads, by the CPU's model. Debian 12's (0.3.21) does not
// know recent models (an Intel Xeon of model 207 with AVX-512 and AMX) and falls back to its
// Prescott (SSE3) kernels: prompts of 4096 tokens were read at half the speed (96 against 199
// tokens/s, bench/RESULTS.md, 2026-12-06, seventh session). It reads OPENBLAS_CORETYPE only as it
// loads, so a process that finds that fallback on a CPU with AVX-512 or AVX2 starts itself again
// with the variable set.
#pragma once

#include <string_view>

namespace fpa::cpu {

// The kernels OpenBLAS runs ("Prescott", "SkylakeX", "Zen", ...).
std::string_view blas_core();

// Where OpenBLAS runs its Prescott kernels on a CPU with better ones and OPENBLAS_CORETYPE is
// unset: sets it (SkylakeX with AVX-512, else Haswell with AVX2 and FMA) and executes this
// program again with `argv` (it does not return then). Call first thing in main, before any
// thread starts. Otherwise, or where the exec fails (said on stderr), returns.
void restart_for_blas_kernels(char** argv);

}  // namespace fpa::cpu
