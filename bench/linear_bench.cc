// One projection shape in every CPU weight format, on cold weights: the measurements issue 26
// leaves to a quiet machine. Where oneDNN's int8 matmul overtakes the hand-written kernel
// (int8 against int8-onednn by token count: kInt8GemvTokens), and whether prefill is faster
// through int8 or bf16 (both at 512 tokens). Timing only: run it on a quiet machine.
//
//   build/bench/fpa-linear-bench --rows 5632 --cols 2048 --tokens 1,2,4,8,16,32,512
//
// --matrices copies of the matrix are read in turn, so that a pass streams more bytes than the
// last-level cache holds (raise it for a large cache). One JSON line per format and token count:
// the fastest pass's GB/s of weights and GFLOP/s, and the share of the CPU the host took meanwhile
// (bench/cpu_stolen.h).
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "bench/cpu_stolen.h"
#include "kernels/cpu/bf16_linear.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, rows, 5632, "output rows of the matrix");
ABSL_FLAG(int, cols, 2048, "input columns of the matrix");
ABSL_FLAG(std::vector<std::string>, tokens,
          std::vector<std::string>({"1", "2", "4", "8", "16", "32", "512"}), "token counts");
ABSL_FLAG(std::vector<std::string>, formats,
          std::vector<std::string>({"f32", "bf16", "int8", "int8-vnni", "int8-onednn"}),
          "weight formats (int8: the backend's choice; int8-vnni: no AMX tiles; int8-onednn: "
          "oneDNN's matmul at every token count)");
ABSL_FLAG(int, matrices, 32, "copies read in turn (each format's bytes: copies x its size)");
ABSL_FLAG(int, threads, 2, "threads, as the backend's pool");
ABSL_FLAG(double, seconds, 0.5, "time per measurement (the fastest pass is kept)");

namespace fpa::bench {
namespace {

// y = x w^T for one copy of the matrix, in one format.
using Product = std::function<void(const float* x, int n, int copy, float* y)>;

// The copies in `format` and the product over one of them. Float32 copies of the weights are
// the model's own layout; the others are packed from them.
struct Format {
  std::vector<std::vector<float>> f32;
  std::vector<std::unique_ptr<cpu::Bf16Matrix>> bf16;
  std::vector<std::unique_ptr<cpu::Int8Matrix>> int8;
  double bytes_per_weight = 4;
};

Product make(const std::string& name, const std::vector<float>& w, int rows, int cols, int copies,
             cpu::ThreadPool* pool, Format& f) {
  const Matrix m{w.data(), rows, cols};
  if (name == "f32") {
    f.f32.assign(copies, w);
    return [&f, rows, cols, pool](const float* x, int n, int c, float* y) {
      cpu::linear(x, n, Matrix{f.f32[c].data(), rows, cols}, y, pool);
    };
  }
  if (name == "bf16") {
    for (int c = 0; c < copies; ++c) f.bf16.push_back(std::make_unique<cpu::Bf16Matrix>(m));
    f.bytes_per_weight = 2;
    return [&f, pool](const float* x, int n, int c, float* y) {
      cpu::linear_bf16(x, n, *f.bf16[c], y, pool);
    };
  }
  for (int c = 0; c < copies; ++c) f.int8.push_back(std::make_unique<cpu::Int8Matrix>(m));
  f.bytes_per_weight = 1;
  cpu::Int8Route route;
  if (name == "int8-onednn") route.gemv_tokens = 0;
  if (name == "int8-vnni") route = cpu::kInt8NoTiles;
  return [&f, pool, route](const float* x, int n, int c, float* y) {
    cpu::linear_int8(x, n, *f.int8[c], y, pool, false, route);
  };
}

// Seconds of the fastest pass over every copy.
double best_pass(const Product& product, const float* x, int n, int copies, float* y) {
  double best = 1e300, total = 0;
  for (int i = 0; i < 3 || total < absl::GetFlag(FLAGS_seconds); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < copies; ++c) product(x, n, c, y);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

int run() {
  const int rows = absl::GetFlag(FLAGS_rows), cols = absl::GetFlag(FLAGS_cols);
  const int copies = absl::GetFlag(FLAGS_matrices);
  std::vector<int> counts;
  for (const std::string& t : absl::GetFlag(FLAGS_tokens)) {
    int n = 0;
    if (absl::SimpleAtoi(t, &n) && n > 0) counts.push_back(n);
  }
  std::mt19937 rng(0);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows) * cols), x(static_cast<size_t>(cols) * 512);
  for (float& v : w) v = d(rng);
  for (float& v : x) v = d(rng);
  cpu::ThreadPool pool(absl::GetFlag(FLAGS_threads));
  for (const std::string& name : absl::GetFlag(FLAGS_formats)) {
    Format f;
    const Product product = make(name, w, rows, cols, copies, &pool, f);
    for (int n : counts) {
      std::vector<float> xs(static_cast<size_t>(n) * cols), y(static_cast<size_t>(n) * rows);
      for (size_t i = 0; i < xs.size(); ++i) xs[i] = x[i % x.size()];
      const CpuStolen stolen;
      const double s = best_pass(product, xs.data(), n, copies, y.data());
      const double weights = double{f.bytes_per_weight} * rows * cols * copies;
      std::cout << nlohmann::json{{"format", name},
                                  {"rows", rows},
                                  {"cols", cols},
                                  {"tokens", n},
                                  {"copies", copies},
                                  {"weight_gbps", weights / s / 1e9},
                                  {"gflops", 2.0 * n * rows * cols * copies / s / 1e9},
                                  {"cpu_stolen", stolen.fraction()}}
                       .dump()
                << std::endl;
    }
  }
  return 0;
}

}  // namespace
}  // namespace fpa::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fpa::bench::run();
}
