// Whether the machine's cores share their last-level cache: a buffer read twice on CPU 0, then
// timed read again on CPU 0 and, after the same warm-up, on CPU 1; then on CPU 1 after a 1 GiB
// write flushed it (cold). One JSON line per size, GB/s of one thread each. Where "other" is near
// "cold", what one core cached the other fetches from DRAM: a repeat of a kernel call whose
// streams land on the other core is no hot repeat, and a buffer one core writes costs the other a
// DRAM-like miss per line (bench/RESULTS.md, 2026-12-06, third session).
//   build/bench/fpa-cross-core-read --mib 4,8,16,24
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"

ABSL_FLAG(std::vector<std::string>, mib, std::vector<std::string>({"4", "8", "16", "24"}),
          "buffer sizes in MiB");
ABSL_FLAG(int, repeats, 5, "timed reads per case (their mean is printed)");

namespace fpa::bench {
namespace {

// Runs f on a thread pinned to `cpu` and waits for it; false where the thread cannot be pinned
// there (no such CPU), f not run.
template <class F>
bool on_cpu(int cpu, const F& f) {
  bool pinned = false;
  std::thread([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
    if (pinned) f();
  }).join();
  return pinned;
}

// GB/s of one pass of 512-bit loads over buf.
[[gnu::target("avx512f")]] double read_pass(const char* buf, size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  __m512i a = _mm512_setzero_si512(), b = a;
  for (size_t i = 0; i < bytes; i += 128) {
    a = _mm512_xor_si512(a, _mm512_load_si512(buf + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(buf + i + 64));
  }
  alignas(64) long long out[8];
  _mm512_store_si512(out, _mm512_xor_si512(a, b));
  volatile long long sink = out[0];
  (void)sink;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(bytes) / s / 1e9;
}

int run() {
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::vector<char> flush(size_t{1} << 30);
  for (const std::string& mib : absl::GetFlag(FLAGS_mib)) {
    const size_t bytes = std::stoull(mib) << 20;
    char* buf = static_cast<char*>(std::aligned_alloc(64, bytes));
    std::memset(buf, 1, bytes);
    double same = 0, other = 0, cold = 0;
    for (int r = 0; r < repeats; ++r) {
      on_cpu(0,
             [&] { read_pass(buf, bytes), read_pass(buf, bytes), same += read_pass(buf, bytes); });
      on_cpu(0, [&] { read_pass(buf, bytes), read_pass(buf, bytes); });
      if (!on_cpu(1, [&] { other += read_pass(buf, bytes); })) {
        std::fprintf(stderr, "cannot run on CPU 1: this probe needs two CPUs\n");
        return 1;
      }
      std::memset(flush.data(), r, flush.size());
      on_cpu(1, [&] { cold += read_pass(buf, bytes); });
    }
    std::printf(
        "{\"mib\":%s,\"same_core_gbps\":%.1f,\"other_core_gbps\":%.1f,\"cold_gbps\":%.1f}\n",
        mib.c_str(), same / repeats, other / repeats, cold / repeats);
    std::free(buf);
  }
  return 0;
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fpa::bench::run();
}
