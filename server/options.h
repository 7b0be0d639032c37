// fpa-serve's command line (docs/serving.md lists the flags and their defaults).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace fpa::server {

inline constexpr double kDefaultPrefixCacheShare = 0.5;

struct ServeOptions {
  std::string model = "models/fpa-v2";
  std::string address = "0.0.0.0:50051";
  std::string metrics_address = "0.0.0.0:9400";
  std::string http_address = "0.0.0.0:8000";
  std::string served_model_name;  // the model directory's name when empty
  std::string api_key;            // empty: the HTTP API is open
  std::string backend = "auto";   // auto | cpu | cuda
  int64_t cache_bytes = 268435456;
  std::optional<int64_t> cache_pages;
  int page_slots = 16;
  int max_batch = 32;
  int max_queue = 256;
  int max_prompt_tokens = 65536;
  int max_new_tokens = 4096;
  int prefill_chunk = 256;
  double cache_watermark = 0.01;  // share of the pool admission leaves free
  // Share of the pool cached prefixes may hold; 0 = off. Absent: kDefaultPrefixCacheShare on the
  // CPU backend, off on CUDA's (server/main.cc). On by default as vLLM's: snapshots are
  // reclaimable (admission counts them free, the planner drops them before it preempts) and a
  // finished request's sequence is its own snapshot, no copy; measured beside --prefix-cache 0 in
  // bench/RESULTS.md.
  std::optional<double> prefix_cache;
  std::optional<float> tau;          // the model's tau when absent
  int threads = 0;                   // 0 = every core
  std::string cpu_weights = "auto";  // auto | f32 | bf16 | int8: the CPU backend's projections
  std::string kv_dtype = "auto";     // auto | f32 | bf16: the CPU backend's KV cache pages
  double drain_seconds = 30;
  // gRPC connections (docs/serving.md, "What the server promises").
  int max_connections = 1024;
  // HTTP API connections; absent = the larger of 1024 and --max-batch + --max-queue + 64, so
  // that every request the scheduler could hold has a connection to wait on.
  std::optional<int> http_max_connections;
  double handshake_timeout_seconds = 10;
  double idle_timeout_seconds = 300;
  double keepalive_seconds = 60;
  int max_streams_per_connection = 64;
  bool help = false;
};

// Parses `--flag value` and `--flag=value`. InvalidArgument naming the flag on any problem.
absl::StatusOr<ServeOptions> parse_options(int argc, char** argv);
std::string usage();

}  // namespace fpa::server
