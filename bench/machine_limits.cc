// The machine's limits that bench/llama_cpp_compare.py sets every figure beside (issue 26): read
// bandwidth over buffers from cache-sized to DRAM-sized, oneDNN's f32 / bf16 / int8 matrix
// product rates, and the CPU's name, cache sizes and features. Timing only: run it on a quiet
// machine, as the comparison does.
//
//   build/bench/fpa-machine-limits --threads 2
//
// Prints one JSON line: {"cpu": {...}, "read_gbps": {"<MiB>": GB/s, ...}, "gflops": {...},
// "cpu_stolen": the share of the CPU the host took meanwhile (bench/cpu_stolen.h)}.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/cpu_stolen.h"
#include "kernels/cpu/int8_amx.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, threads, 2, "threads, as each engine runs with");
ABSL_FLAG(std::vector<std::string>, read_mib,
          std::vector<std::string>({"4", "8", "16", "32", "64", "128", "256", "1024"}),
          "buffer sizes (MiB) whose read bandwidth is measured");
ABSL_FLAG(double, seconds, 0.5, "time per measurement (the best of its repeats is kept)");
ABSL_FLAG(bool, products, true,
          "measure the product rates too (off: read bandwidth alone, a few seconds less)");

namespace fpa::bench {
namespace {

using Dt = dnnl::memory::data_type;

// Seconds per call of f, the fastest of repeats filling about --seconds.
template <class F>
double best_seconds(const F& f) {
  double best = 1e300, total = 0;
  for (int i = 0; i < 3 || total < absl::GetFlag(FLAGS_seconds); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

// Every byte of `bytes` read once per pass, split over the threads as the engines split a
// matrix: 512-bit loads, four independent chains per thread. `huge`: on 2 MiB pages where the
// kernel gives them (advised before the first write).
[[gnu::target("avx512f")]] double read_gbps_on(size_t bytes, int threads, bool huge) {
  const size_t n = bytes / 64;
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t size = (n * 64 + kHugePage - 1) / kHugePage * kHugePage;
  auto* buf = static_cast<__m512i*>(std::aligned_alloc(kHugePage, size));
  if (huge) madvise(buf, size, MADV_HUGEPAGE);
#pragma omp parallel for num_threads(threads)
  for (size_t i = 0; i < n; ++i) buf[i] = _mm512_set1_epi64(static_cast<long long>(i));
  volatile long long sink = 0;
  const double s = best_seconds([&] {
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t lo = n * t / nt / 4 * 4, hi = n * (t + 1) / nt / 4 * 4;
      __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
      for (size_t i = lo; i < hi; i += 4) {
        a = _mm512_xor_si512(a, _mm512_load_si512(buf + i));
        b = _mm512_xor_si512(b, _mm512_load_si512(buf + i + 1));
        c = _mm512_xor_si512(c, _mm512_load_si512(buf + i + 2));
        d = _mm512_xor_si512(d, _mm512_load_si512(buf + i + 3));
      }
      alignas(64) long long out[8];
      _mm512_store_si512(out, _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d)));
      sink = sink + out[0];
    }
  });
  std::free(buf);
  return static_cast<double>(n) * 64 / s / 1e9;
}

// The faster of the two page sizes: from DRAM a stream read 5-8% faster on 2 MiB pages than on
// 4 KiB ones on the AMD EPYC of 2026-12-05 (bench/RESULTS.md), from the LLC no faster. The limit
// is what the machine can read, whichever pages an engine's weights are on.
double read_gbps(size_t bytes, int threads) {
  return std::max(read_gbps_on(bytes, threads, false), read_gbps_on(bytes, threads, true));
}

// oneDNN's matmul [m, k] x [k, n] in the engines' formats (f32; bf16 -> f32; u8 x s8 -> s32),
// weights packed once and hot: the compute rate prefill can reach.
double matmul_gflops(Dt src, Dt wei, Dt dst, int m, int k, int n, int threads) {
  const size_t esize = wei == Dt::s8 ? 1 : wei == Dt::bf16 ? 2 : 4;
  std::vector<char> w(static_cast<size_t>(n) * k * esize, 1), x(static_cast<size_t>(m) * k * 4, 1),
      y(static_cast<size_t>(m) * n * 4);
  const cpu::PackedWeights packed = cpu::pack_weights(w.data(), n, k, wei, src, dst);
  const dnnl::matmul mm = cpu::matmul(packed.mem, n, k, m, src, dst, false);
  const dnnl::engine& e = cpu::onednn_engine();
  const dnnl::memory xs(cpu::rows_desc(m, k, src), e, x.data());
  const dnnl::memory ys(cpu::rows_desc(m, n, dst), e, y.data());
  cpu::ThreadPool pool(threads);
  const double s = best_seconds([&] { cpu::run_matmul(mm, xs, packed.mem, ys, &pool); });
  return 2.0 * m * k * n / s / 1e9;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "?";
}

nlohmann::json cpu_info() {
  return {{"model", cpu_name()},
          {"l1d_bytes", sysconf(_SC_LEVEL1_DCACHE_SIZE)},
          {"l2_bytes", sysconf(_SC_LEVEL2_CACHE_SIZE)},
          {"l3_bytes", sysconf(_SC_LEVEL3_CACHE_SIZE)},
          {"avx512_bf16", __builtin_cpu_supports("avx512bf16") != 0},
          {"avx512_vnni", __builtin_cpu_supports("avx512vnni") != 0},
          {"amx_int8", cpu::cpu_has_amx_int8()},
          {"online_cpus", sysconf(_SC_NPROCESSORS_ONLN)}};
}

int run() {
  const int threads = absl::GetFlag(FLAGS_threads);
  const CpuStolen stolen;
  nlohmann::json read;
  for (const std::string& mib : absl::GetFlag(FLAGS_read_mib)) {
    read[mib] = read_gbps(std::stoull(mib) << 20, threads);
  }
  nlohmann::json out{{"cpu", cpu_info()}, {"threads", threads}, {"read_gbps", read}};
  if (absl::GetFlag(FLAGS_products)) {
    // 512 tokens against a 2048 x 2048 matrix: a prefill chunk's product.
    const int m = 512, k = 2048, n = 2048;
    out["gflops"] = {{"f32", matmul_gflops(Dt::f32, Dt::f32, Dt::f32, m, k, n, threads)},
                     {"bf16", matmul_gflops(Dt::bf16, Dt::bf16, Dt::f32, m, k, n, threads)},
                     {"int8", matmul_gflops(Dt::u8, Dt::s8, Dt::s32, m, k, n, threads)}};
    out["gemm_shape"] = {m, k, n};
  }
  out["cpu_stolen"] = stolen.fraction();
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fpa::bench::run();
}
