// CUDA decode benchmark (issue 5): decode tokens/s at batch 1, 32, 128 and context 2K / 16K with
// eviction on and off, the decode step settled per layer / per step / as one graph, the attention
// kernel's achieved memory bandwidth against the device's peak, and the speedup over the CPU
// backend, all measured side by side in one run.
//
// The model is synthetic (synthetic_model.h: 4 layers, 8 heads x 128, d_model 1024) and the
// context is written straight into the cache (random keys on the walk the model continues), so
// the run measures decoding, not the prefill. With eviction on, every head keeps its last 256
// keys (tau = 20 over a walk falling 20/256 a token); off, it keeps the whole context.
//
// Usage: cuda_decode_bench [--steps N] [--cpu-threads N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/stream_access.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/step_plan.h"
#include "tests/gpu/synthetic_model.h"

namespace fpa::bench {
namespace {

constexpr int kPageSlots = 16;
constexpr int kKeptWithEviction = 256;

struct Config {
  int batch;
  int context;
  bool evict;
};

struct Options {
  int steps = 8;
  int cpu_threads = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

int kept_keys(const Config& c) { return c.evict ? kKeptWithEviction : c.context; }

std::unique_ptr<cache::KvCache> make_cache(const Model& model, const Config& c, int steps,
                                           bool host_storage) {
  const ModelConfig& m = model.config();
  const int64_t per_stream = (kept_keys(c) + steps + kPageSlots - 1) / kPageSlots + 2;
  const int64_t pages = int64_t{c.batch} * m.n_layers * m.n_heads * per_stream;
  // The device pool stores bf16 (the backend runs with half_precision below).
  const int kv = host_storage ? 4 : kv_bytes(CudaOptions{.half_precision = true});
  auto cache = cache::KvCache::create({m.n_layers, m.n_heads, m.head_dim, kPageSlots, kv}, pages,
                                      host_storage);
  die(cache.status(), "cache");
  return *std::move(cache);
}

std::vector<cache::SeqId> add_sequences(cache::KvCache& cache, const Config& c) {
  std::vector<cache::SeqId> seqs;
  for (int b = 0; b < c.batch; ++b) {
    auto seq = cache.add_sequence(
        {.policy = c.evict ? cache::Policy::kFpa : cache::Policy::kNone, .tau = 20.0f});
    die(seq.status(), "add_sequence");
    seqs.push_back(*seq);
  }
  return seqs;
}

// Decode steps of the whole batch (after one warm-up step): tokens per second.
double time_decode(Backend& backend, const std::vector<cache::SeqId>& seqs, const Config& c,
                   int vocab, int steps) {
  std::vector<int32_t> tokens(seqs.size(), 'a');
  std::vector<float> logits(seqs.size() * vocab);
  std::vector<cache::BatchItem> items(seqs.size());
  auto step = [&](int s) {
    for (size_t b = 0; b < seqs.size(); ++b) {
      items[b] = {seqs[b], std::span(tokens).subspan(b, 1), c.context + s};
    }
    die(backend.forward(items, logits), "forward");
  };
  step(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 1; s <= steps; ++s) step(s);
  return static_cast<double>(seqs.size()) * steps / seconds_since(t0);
}

double cuda_tokens_per_second(const Model& model, const Config& c, int steps, float drift,
                              CudaOptions options = {.half_precision = true}) {
  auto cache = make_cache(model, c, steps + 1, /*host_storage=*/false);
  auto backend = create_cuda_backend(model, *cache, options);
  die(backend.status(), "cuda backend");
  const std::vector<cache::SeqId> seqs = add_sequences(*cache, c);
  for (cache::SeqId s : seqs) {
    die((*backend)->append_synthetic_keys(s, 0, c.context, -drift, kept_keys(c)), "context");
  }
  return time_decode(**backend, seqs, c, model.config().vocab_size, steps);
}

// The same context in a host cache: random k and v written through insert.
double cpu_tokens_per_second(const Model& model, const Config& c, int steps, float drift,
                             int threads) {
  auto cache = make_cache(model, c, steps + 1, /*host_storage=*/true);
  auto backend = make_cpu_backend(model, *cache, threads);
  die(backend.status(), "cpu backend");
  const std::vector<cache::SeqId> seqs = add_sequences(*cache, c);
  const ModelConfig& m = model.config();
  // A few hundred random rows, reused: generating a fresh one per key would dominate the fill.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> rows(static_cast<size_t>(509) * m.head_dim);
  for (float& x : rows) x = u(rng);
  size_t next = 0;
  auto row = [&] { return rows.data() + (next++ % 500) * m.head_dim; };
  for (cache::SeqId s : seqs) {
    for (int l = 0; l < m.n_layers; ++l) {
      for (int h = 0; h < m.n_heads; ++h) {
        for (const cuda::SyntheticKey& key :
             cuda::synthetic_walk(c.context, 0.0f, -drift, kept_keys(c))) {
          die(cache::StreamAccess(*cache)
                  .insert(s, l, h, key.offset, key.lvl, row(), row(), key.m)
                  .status(),
              "insert");
        }
        cache::StreamAccess(*cache).set_last_phi(s, l, h, -drift * c.context);
      }
    }
  }
  return time_decode(**backend, seqs, c, m.vocab_size, steps);
}

// The device's peak memory bandwidth in bytes/s (HBM: two transfers a clock).
double peak_bandwidth() {
  int device = 0, clock_khz = 0, bus_bits = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
}

template <typename T>
T* device_array(const std::vector<T>& host) {
  T* p = nullptr;
  if (cudaMalloc(&p, host.size() * sizeof(T)) != cudaSuccess) die(absl::InternalError("oom"), "");
  cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

// The decode attention kernel alone over `batch` sequences x 8 heads x `context` live bf16 keys
// of head_dim 128: bytes it must move / kernel time.
double attention_bandwidth(int batch, int context) {
  constexpr int kHeads = 8, kHeadDim = 128;
  const int per_stream = context / kPageSlots;
  const int streams = batch * kHeads;
  const size_t slots = static_cast<size_t>(streams) * per_stream * kPageSlots;
  cuda::PoolView pool;
  pool.page_slots = kPageSlots;
  pool.head_dim = kHeadDim;
  pool.type = cuda::KvType::kBf16;
  void* mem = nullptr;
  const size_t kv = slots * kHeadDim * 2;
  if (cudaMalloc(&mem, 2 * kv + 3 * slots * 4) != cudaSuccess) return 0.0;
  char* base = static_cast<char*>(mem);
  cudaMemset(base, 0x3c, 2 * kv);  // small bf16 values
  pool.k = base;
  pool.v = base + kv;
  pool.lvl = reinterpret_cast<float*>(base + 2 * kv);
  pool.m = pool.lvl + slots;
  pool.pos = reinterpret_cast<int32_t*>(pool.m + slots);
  cudaMemset(pool.lvl, 0, slots * 4);
  cudaMemset(pool.m, 0, slots * 4);
  cudaMemset(pool.pos, 0, slots * 4);  // every key live at position 0

  std::vector<int32_t> seq_ids(batch), ones(batch, 1), pos0(batch, context), ids, off, cnt;
  for (int b = 0; b < batch; ++b) seq_ids[b] = b;
  for (int s = 0; s < streams; ++s) {
    off.push_back(static_cast<int32_t>(ids.size()));
    cnt.push_back(per_stream);
    for (int p = 0; p < per_stream; ++p) ids.push_back(s * per_stream + p);
  }
  const int width = kHeads * kHeadDim;
  const int splits = cuda::attention_splits(streams, context);
  cuda::AttentionArgs a;
  a.qkv = device_array(std::vector<float>(static_cast<size_t>(batch) * 3 * width, 0.01f));
  a.qkv_stride = 3 * width;
  a.phi = a.lvl = a.cmin = device_array(std::vector<float>(streams, 0.0f));
  a.row_item = a.item_row0 = device_array(seq_ids);
  a.item_len = device_array(ones);
  a.item_pos0 = device_array(pos0);
  a.thr = device_array(std::vector<float>(streams, 1e30f));
  a.beta = device_array(std::vector<float>(kHeads, 1.0f));
  a.page_ids = device_array(ids);
  a.page_off = device_array(off);
  a.page_cnt = device_array(cnt);
  a.rows = a.items = batch;
  a.n_heads = kHeads;
  a.splits = splits;
  a.partial =
      device_array(std::vector<float>(static_cast<size_t>(streams) * splits * (kHeadDim + 2)));
  a.out = device_array(std::vector<float>(static_cast<size_t>(batch) * width));

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  constexpr int kIters = 20;
  die(cuda::launch_attention(a, pool, nullptr), "attention kernel");
  cudaEventRecord(start);
  for (int i = 0; i < kIters; ++i)
    die(cuda::launch_attention(a, pool, nullptr), "attention kernel");
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  const cudaError_t err = cudaGetLastError();
  cudaFree(mem);
  for (const void* p : {static_cast<const void*>(a.qkv), static_cast<const void*>(a.phi),
                        static_cast<const void*>(a.row_item), static_cast<const void*>(a.item_len),
                        static_cast<const void*>(a.item_pos0), static_cast<const void*>(a.thr),
                        static_cast<const void*>(a.beta), static_cast<const void*>(a.page_ids),
                        static_cast<const void*>(a.page_off), static_cast<const void*>(a.page_cnt),
                        static_cast<const void*>(a.partial), static_cast<const void*>(a.out)}) {
    cudaFree(const_cast<void*>(p));
  }
  if (err != cudaSuccess) {
    std::fprintf(stderr, "attention kernel: %s\n", cudaGetErrorString(err));
    return 0.0;
  }
  // k + v, lvl, m read and written, pos, and the page ids.
  const double bytes = static_cast<double>(slots) * (2.0 * kHeadDim * 2 + 16) + ids.size() * 4.0;
  return bytes * kIters / (ms * 1e-3);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) o.steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--cpu-threads")) o.cpu_threads = std::atoi(argv[i + 1]);
  }
  if (o.cpu_threads <= 0) o.cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  return o;
}

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (!cuda_device_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double peak = peak_bandwidth();
  std::printf("device: %s, peak memory bandwidth %.0f GB/s\n", prop.name, peak / 1e9);
  const SyntheticShape shape;
  const std::unique_ptr<Model> model = make_synthetic_model(shape, 1);
  std::printf("model: %d layers, %d heads x %d, d_model %d, d_ff %d, bf16; %d decode steps\n\n",
              shape.n_layers, shape.n_heads, shape.head_dim, shape.d_model, shape.d_ff, opt.steps);

  std::printf("## decode tokens/s (CUDA)\n%-8s %-8s %-9s %12s\n", "batch", "context", "eviction",
              "tokens/s");
  std::vector<std::pair<Config, double>> cuda_rates;
  for (int context : {2048, 16384}) {
    for (bool evict : {false, true}) {
      for (int batch : {1, 32, 128}) {
        const Config c{batch, context, evict};
        const double rate = cuda_tokens_per_second(*model, c, opt.steps, shape.drift);
        cuda_rates.push_back({c, rate});
        std::printf("%-8d %-8d %-9s %12.1f\n", batch, context, evict ? "on" : "off", rate);
        std::fflush(stdout);
      }
    }
  }

  // The decode step's host round-trips: per layer (the old design), once a step launch by launch,
  // and once a step as one CUDA graph.
  std::printf("\n## decode step paths, context 2048, eviction on (tokens/s)\n%-8s %14s %14s %14s\n",
              "batch", "per-layer", "per-step", "graph");
  for (int batch : {1, 32}) {
    const Config c{batch, 2048, true};
    double rate[3];
    const CudaOptions paths[] = {{.settle_after_step = false, .graphs = false},
                                 {.settle_after_step = true, .graphs = false},
                                 {.settle_after_step = true, .graphs = true}};
    for (int p = 0; p < 3; ++p)
      rate[p] = cuda_tokens_per_second(*model, c, opt.steps, shape.drift, paths[p]);
    std::printf("%-8d %14.1f %14.1f %14.1f\n", batch, rate[0], rate[1], rate[2]);
    std::fflush(stdout);
  }

  std::printf("\n## attention kernel bandwidth (bf16 keys, all live)\n%-8s %-8s %10s %8s\n",
              "batch", "context", "GB/s", "of peak");
  for (auto [batch, context] : {std::pair{1, 16384}, {32, 16384}, {128, 2048}, {128, 16384}}) {
    const double bw = attention_bandwidth(batch, context);
    if (peak > 0.0) {
      std::printf("%-8d %-8d %10.0f %7.1f%%\n", batch, context, bw / 1e9, 100.0 * bw / peak);
    } else {
      std::printf("%-8d %-8d %10.0f %8s\n", batch, context, bw / 1e9, "n/a");
    }
  }

  std::printf("\n## speedup over the CPU backend (%d threads)\n%-8s %-8s %-9s %12s %12s %9s\n",
              opt.cpu_threads, "batch", "context", "eviction", "cpu tok/s", "cuda tok/s",
              "speedup");
  for (const auto& [c, rate] : cuda_rates) {
    if (c.context != 2048 || c.batch > 32) continue;
    const double cpu = cpu_tokens_per_second(*model, c, 3, shape.drift, opt.cpu_threads);
    std::printf("%-8d %-8d %-9s %12.1f %12.1f %8.1fx\n", c.batch, c.context, c.evict ? "on" : "off",
                cpu, rate, rate / cpu);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) { return fpa::bench::run(argc, argv); }
