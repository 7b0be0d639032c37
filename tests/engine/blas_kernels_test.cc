// Debian 12's OpenBLAS falls back to its Prescott (SSE3) kernels on CPU models it does not know;
// every program of ours that runs the CPU backend starts again with better ones
// (kernels/cpu/blas_kernels.h). This program does as they do, first thing in main.
#include "kernels/cpu/blas_kernels.h"

#include <gtest/gtest.h>

namespace fpa::cpu {
namespace {

TEST(BlasKernels, NotPrescottWhereTheCpuHasAvx2) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "no AVX2 and FMA: Prescott's kernels are OpenBLAS's best here";
  }
  EXPECT_NE(blas_core(), "Prescott");
}

}  // namespace
}  // namespace fpa::cpu

int main(int argc, char** argv) {
  fpa::cpu::restart_for_blas_kernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
