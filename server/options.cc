#include "server/options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fpa::server {
namespace {

struct Flag {
  absl::string_view name;
  absl::string_view value_name;
  absl::string_view help;
  // Stores the parsed value; false when it does not parse or is out of range.
  std::function<bool(ServeOptions&, absl::string_view)> set;
};

template <typename T>
std::function<bool(ServeOptions&, absl::string_view)> integer(T ServeOptions::*field, T min) {
  return [field, min](ServeOptions& o, absl::string_view v) {
    T x;
    if (!absl::SimpleAtoi(v, &x) || x < min) return false;
    o.*field = x;
    return true;
  };
}

// A finite number of seconds >= `min`.
std::function<bool(ServeOptions&, absl::string_view)> seconds(double ServeOptions::*field,
                                                              double min) {
  return [field, min](ServeOptions& o, absl::string_view v) {
    double x;
    if (!absl::SimpleAtod(v, &x) || !std::isfinite(x) || x < min) return false;
    o.*field = x;
    return true;
  };
}

// One of `allowed`.
std::function<bool(ServeOptions&, absl::string_view)> choice(
    std::string ServeOptions::*field, std::vector<absl::string_view> allowed) {
  return [field, allowed](ServeOptions& o, absl::string_view v) {
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) return false;
    o.*field = std::string(v);
    return true;
  };
}

std::function<bool(ServeOptions&, absl::string_view)> text(std::string ServeOptions::*field) {
  return [field](ServeOptions& o, absl::string_view v) {
    if (v.empty()) return false;
    o.*field = std::string(v);
    return true;
  };
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> kFlags = {
      {"model", "DIR", "model directory (config.json + model.safetensors) [models/fpa-v2]",
       text(&ServeOptions::model)},
      {"address", "HOST:PORT", "gRPC listen address; port 0 picks a free one [0.0.0.0:50051]",
       text(&ServeOptions::address)},
      {"metrics-address", "HOST:PORT", "Prometheus /metrics HTTP address [0.0.0.0:9400]",
       text(&ServeOptions::metrics_address)},
      {"http-address", "HOST:PORT",
       "OpenAI-compatible HTTP API, /health and /metrics [0.0.0.0:8000]",
       text(&ServeOptions::http_address)},
      {"served-model-name", "NAME",
       "the model's name in the HTTP API and the metrics' model_name [the --model folder's name]",
       text(&ServeOptions::served_model_name)},
      {"api-key", "KEY",
       "require 'Authorization: Bearer KEY' on the HTTP API; /health and /metrics stay open [none]",
       text(&ServeOptions::api_key)},
      {"backend", "auto|cpu|cuda", "compute backend; auto = CUDA when a device is present [auto]",
       choice(&ServeOptions::backend, {"auto", "cpu", "cuda"})},
      {"cache-bytes", "N", "KV page pool size in bytes [268435456]",
       integer(&ServeOptions::cache_bytes, int64_t{1})},
      {"cache-pages", "N", "KV page pool size in pages (overrides --cache-bytes)",
       [](ServeOptions& o, absl::string_view v) {
         int64_t x;
         if (!absl::SimpleAtoi(v, &x) || x < 1) return false;
         o.cache_pages = x;
         return true;
       }},
      {"page-slots", "N", "slots per page [16]", integer(&ServeOptions::page_slots, 1)},
      {"max-batch", "N", "sequences decoded together [32]", integer(&ServeOptions::max_batch, 1)},
      {"max-queue", "N", "waiting requests before RESOURCE_EXHAUSTED [256]",
       integer(&ServeOptions::max_queue, 0)},
      {"max-prompt-tokens", "N", "longer prompts are INVALID_ARGUMENT [65536]",
       integer(&ServeOptions::max_prompt_tokens, 1)},
      {"max-new-tokens", "N",
       "upper bound of a request's max_new_tokens, and a chat's default [4096]",
       integer(&ServeOptions::max_new_tokens, 1)},
      {"prefill-chunk", "N", "prompt tokens per scheduler iteration [256]",
       integer(&ServeOptions::prefill_chunk, 1)},
      {"cache-watermark", "F",
       "share of the KV pool admission keeps free for running requests to grow into [0.01]",
       [](ServeOptions& o, absl::string_view v) {
         double x;
         if (!absl::SimpleAtod(v, &x) || !(x >= 0 && x < 1)) return false;
         o.cache_watermark = x;
         return true;
       }},
      {"prefix-cache", "F",
       "share of the KV pool cached prompt prefixes may hold; 0 turns the prefix cache off [0.5 on "
       "cpu, 0 on cuda]",
       [](ServeOptions& o, absl::string_view v) {
         double x;
         if (!absl::SimpleAtod(v, &x) || !(x >= 0 && x <= 1)) return false;
         o.prefix_cache = x;
         return true;
       }},
      {"tau", "X", "default FPA eviction threshold in logit units [the model's tau]",
       [](ServeOptions& o, absl::string_view v) {
         float x;
         if (!absl::SimpleAtof(v, &x) || !std::isfinite(x) || x <= 0) return false;
         o.tau = x;
         return true;
       }},
      {"threads", "N", "CPU backend threads; 0 = every core [0]",
       integer(&ServeOptions::threads, 0)},
      {"cpu-weights", "auto|f32|bf16|int8",
       "CPU backend projection weights; bf16 halves the bytes a step reads (needs AVX512-BF16), "
       "int8 quarters them (needs AVX512-VNNI); auto: the most compact the CPU runs of those "
       "measured accurate on the model (config.json formats_within_bounds) [auto]",
       choice(&ServeOptions::cpu_weights, {"auto", "f32", "bf16", "int8"})},
      {"kv-dtype", "auto|f32|bf16",
       "CPU backend KV cache pages: bf16 halves the bytes a key holds and decode reads (lvl and m "
       "stay float32); auto as --cpu-weights; the CUDA pool is bf16 either way [auto]",
       choice(&ServeOptions::kv_dtype, {"auto", "f32", "bf16"})},
      {"drain-seconds", "N", "on SIGTERM: finish in-flight requests for at most this long [30]",
       seconds(&ServeOptions::drain_seconds, 0)},
      {"max-connections", "N", "gRPC connections; more are closed at once [1024]",
       integer(&ServeOptions::max_connections, 1)},
      {"http-max-connections", "N",
       "HTTP API connections; more get 503 [max(1024, --max-batch + --max-queue + 64)]",
       [](ServeOptions& o, absl::string_view v) {
         int x;
         if (!absl::SimpleAtoi(v, &x) || x < 1) return false;
         o.http_max_connections = x;
         return true;
       }},
      {"handshake-timeout-seconds", "N",
       "close a gRPC connection that sends no HTTP/2 preface this long [10]",
       seconds(&ServeOptions::handshake_timeout_seconds, 0.001)},
      {"idle-timeout-seconds", "N", "close a gRPC connection without calls this long [300]",
       seconds(&ServeOptions::idle_timeout_seconds, 0.001)},
      {"keepalive-seconds", "N",
       "ping an idle gRPC connection this often; drop it after 20 s "
       "without an answer [60]",
       seconds(&ServeOptions::keepalive_seconds, 0.001)},
      {"max-streams-per-connection", "N", "concurrent calls on one gRPC connection [64]",
       integer(&ServeOptions::max_streams_per_connection, 1)},
  };
  return kFlags;
}

}  // namespace

std::string usage() {
  std::string out =
      "Usage: fpa-serve [--flag value | --flag=value]...\n"
      "Serves a First Passage Attention model over gRPC (fpa.v1.FpaService) with Prometheus\n"
      "metrics. SIGTERM drains in-flight requests, then exits.\n\nFlags:\n";
  for (const Flag& f : flags()) {
    std::string head = absl::StrCat("  --", f.name, " ", f.value_name);
    head.resize(std::max<size_t>(head.size() + 1, 34), ' ');
    absl::StrAppend(&out, head, f.help, "\n");
  }
  absl::StrAppend(&out, "  --help                          this text\n");
  return out;
}

absl::StatusOr<ServeOptions> parse_options(int argc, char** argv) {
  ServeOptions o;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    if (arg.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    arg.remove_prefix(2);
    absl::string_view name = arg, value;
    bool inline_value = false;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags()) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (!inline_value) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      value = argv[++i];
    }
    if (!flag->set(o, value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": bad value '", value, "' (expected ", flag->value_name, ")"));
    }
  }
  return o;
}

}  // namespace fpa::server
