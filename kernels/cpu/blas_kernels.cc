#include "kernels/cpu/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fpa::cpu {
namespace {

// The kernels OpenBLAS would take for this CPU's features; nullptr: none better than Prescott.
const char* better_core() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

std::string_view blas_core() { return openblas_get_corename(); }

void restart_for_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (blas_core() != "Prescott") return;
  const char* core = better_core();
  if (core == nullptr) return;
  std::fprintf(stderr,
               "OpenBLAS took its Prescott kernels on a CPU model it does not know; starting "
               "again with OPENBLAS_CORETYPE=%s\n",
               core);
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "could not start again (%s); going on with the Prescott kernels\n",
               std::strerror(errno));
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace fpa::cpu
