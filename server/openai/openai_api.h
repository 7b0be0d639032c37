// The OpenAI-compatible HTTP API on --http-address: POST /v1/completions, GET /v1/models,
// GET /health, and GET /metrics beside them (vLLM serves its metrics on the API port too).
// Requests go through the same validation (to_params) and scheduler as gRPC.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/cpu/formats.h"
#include "prometheus/collectable.h"
#include "server/http/http_server.h"
#include "server/metrics/metrics.h"
#include "server/openai/openai_request.h"
#include "server/request/validate.h"
#include "server/scheduler/scheduler.h"

namespace fpa::server {

// Names the request fields that were ignored (unknown to fpa-serve), comma-separated.
inline constexpr std::string_view kIgnoredFieldsHeader = "X-FPA-Ignored-Fields";

struct OpenAiInfo {
  std::string model_name;  // the id /v1/models lists and requests may name
  RequestLimits limits;
  std::string attention;  // the model's attention kind (fpa, fox, softmax), for /v1/models
  std::string api_key;    // --api-key; empty: no check
  CpuFormats formats;     // the CPU backend's, for /v1/models; empty on CUDA
};

class OpenAiApi {
 public:
  OpenAiApi(Scheduler& scheduler, ServerMetrics& metrics, OpenAiInfo info);

  // The handler for http::HttpServer.
  http::Handler handler();
  // From now on /health answers 503 (the scheduler refuses new requests with UNAVAILABLE).
  void set_draining() { draining_ = true; }

 private:
  void route(std::shared_ptr<http::Exchange> exchange);
  // vLLM's POST /tokenize (`encode`) or /detokenize.
  void tokenizer_call(http::Exchange& exchange, bool encode) const;
  // POST /v1/completions, or /v1/chat/completions (`chat`) through the chat template.
  void completions(std::shared_ptr<http::Exchange> exchange, bool chat);
  void models(http::Exchange& exchange) const;
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> choices_of(const CompletionRequest& req);

  Scheduler& scheduler_;
  ServerMetrics& metrics_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  const OpenAiInfo info_;
  const int64_t created_;
  const uint64_t id_prefix_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
  std::atomic<uint64_t> next_seed_;
};

}  // namespace fpa::server
