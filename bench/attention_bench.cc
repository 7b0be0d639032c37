// The CPU decode attention kernel alone: one query per stream over its cached pages, every stream
// of a batch on 2 threads, the pages in a real page table (cache/page_table.h, huge pages) handed
// to the streams interleaved (page by page, as a batch decoding in step takes them from the pool),
// contiguous, or scattered (each stream's pages together, the streams in a shuffled order: the
// page ledger's layout after prefill). Prints the bytes of keys, values and field read per second
// (fastest of --reps), the calls' median and 10th / 90th percentiles, and the share of the CPU
// the host took meanwhile (bench/cpu_stolen.h). With --window a call takes that many streams,
// the next call the next ones: on a pool past the last-level cache each call then reads cold
// pages, as a decode step's call for one layer does.
//   build/bench/fpa-attention-bench --streams 256 --keys 512 --kv_dtype bf16 --layout scattered
//   build/bench/fpa-attention-bench --streams 2048 --window 256 --keys 544 --layout scattered
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/cpu_stolen.h"
#include "cache/page_table.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "model/bf16.h"

ABSL_FLAG(int, streams, 256, "streams (sequences x layers' heads of one layer)");
ABSL_FLAG(int, keys, 512, "cached keys per stream");
ABSL_FLAG(int, head_dim, 64, "head dimension");
ABSL_FLAG(int, page_slots, 16, "slots per page");
ABSL_FLAG(std::string, kv_dtype, "bf16", "f32 | bf16");
ABSL_FLAG(std::string, layout, "interleaved",
          "interleaved | contiguous | scattered (each stream's pages together, the streams in a "
          "shuffled order): the streams' pages");
ABSL_FLAG(bool, then, true,
          "each stream's kernel told the pages of the stream its thread reads next");
ABSL_FLAG(int, threads, 2, "threads");
ABSL_FLAG(int, reps, 15, "timed calls (the fastest and the median are reported)");
ABSL_FLAG(int, window, 0, "streams a call takes, in turn from all of them (0: all)");
ABSL_FLAG(int, spread, 1,
          "pages of the pool per page used (16: a layer's pages among 16 layers' in one pool)");

namespace fpa::bench {
namespace {

int run() {
  const int streams = absl::GetFlag(FLAGS_streams), dim = absl::GetFlag(FLAGS_head_dim);
  const int slots = absl::GetFlag(FLAGS_page_slots);
  const int per = (absl::GetFlag(FLAGS_keys) + slots - 1) / slots;
  const bool bf16 = absl::GetFlag(FLAGS_kv_dtype) == "bf16";
  const std::string layout = absl::GetFlag(FLAGS_layout);
  const bool contiguous = layout == "contiguous", scattered = layout == "scattered";
  const bool then = absl::GetFlag(FLAGS_then);
  const cache::CacheShape shape{1, 1, dim, slots, bf16 ? 2 : 4};
  const int spread = std::max(1, absl::GetFlag(FLAGS_spread));
  auto table = cache::PageTable::create(shape, static_cast<int64_t>(streams) * per * spread, true);
  if (!table.ok()) {
    std::cerr << table.status() << "\n";
    return 1;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<std::vector<cache::PageView>> pages(streams);
  for (int p = 0; p < streams * per; ++p) {
    const cache::PageView v = (*table)->view(p * spread);
    for (int j = 0; j < slots * dim; ++j) {
      if (bf16) {
        v.k16[j] = round_to_bf16(normal(rng)), v.v16[j] = round_to_bf16(normal(rng));
      } else {
        v.k[j] = normal(rng), v.v[j] = normal(rng);
      }
    }
    std::fill_n(v.lvl, slots, 0.0f), std::fill_n(v.m, slots, 1e30f);
    std::fill_n(v.acc, slots, 0.0f);
    for (int j = 0; j < slots; ++j) v.pos[j] = j;
    pages[contiguous || scattered ? p / per : p % streams].push_back(v);
  }
  if (scattered) std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<float> q(dim, 0.1f), own(dim, 0.1f), out(static_cast<size_t>(streams) * dim);
  const cpu::ThreadPool pool(absl::GetFlag(FLAGS_threads));
  const int window =
      absl::GetFlag(FLAGS_window) > 0 ? std::min(absl::GetFlag(FLAGS_window), streams) : streams;
  std::vector<double> ms;
  const CpuStolen stolen;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const int first = static_cast<int>(static_cast<long>(r) * window % (streams - window + 1));
    const auto t0 = std::chrono::steady_clock::now();
    // As the CPU backend shares them out: each thread told the stream it reads next.
    pool.run_ahead(window, [&](int i, int after) {
      const int s = first + i, next = after >= 0 ? first + after : -1;
      const cpu::CachedKeys keys{pages[s], slots, {cache::MassRule::Mode::kNone, 0, 0}};
      cpu::decode_attention(q.data(), 0.0f, {own.data(), own.data()}, {}, dim, keys,
                            out.data() + static_cast<size_t>(s) * dim,
                            then && next >= 0 ? pages[next] : std::span<const cache::PageView>());
    });
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  // Per key: k and v, and the field the kernel reads (pos, lvl, m).
  const double bytes =
      static_cast<double>(window) * per * slots * (2.0 * dim * shape.kv_bytes + 12);
  std::printf(
      "{\"streams\":%d,\"window\":%d,\"spread\":%d,\"keys\":%d,\"kv_dtype\":\"%s\","
      "\"layout\":\"%s\",\"then\":%s,\"ms\":%.3f,\"gb_per_s\":%.2f,\"ms_p10\":%.3f,"
      "\"ms_median\":%.3f,\"ms_p90\":%.3f,\"cpu_stolen\":%.3f}\n",
      streams, window, spread, per * slots, bf16 ? "bf16" : "f32", layout.c_str(),
      then ? "true" : "false", ms[0], bytes / ms[0] / 1e6, ms[ms.size() / 10], ms[ms.size() / 2],
      ms[ms.size() * 9 / 10], stolen.fraction());
  return 0;
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fpa::bench::run();
}
