// The gRPC service fpa.v1.FpaService (callback API). It only validates, hands requests to the
// scheduler and streams back what the scheduler reports; it never touches the model runner.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "cache/kv_cache.h"
#include "model/model.h"
#include "proto/fpa/v1/fpa.grpc.pb.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/validate.h"

namespace fpa::server {

struct ServiceInfo {
  std::string backend;
  RequestLimits limits;
  int max_batch = 0;
};

class FpaServiceImpl final : public v1::FpaService::CallbackService {
 public:
  FpaServiceImpl(const Model& model, const cache::KvCache& cache, Scheduler& scheduler,
                 ServerMetrics& metrics, ServiceInfo info);

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx,
                                     const v1::GenerateRequest* req,
                                     v1::GenerateResponse* resp) override;
  grpc::ServerWriteReactor<v1::GenerateStreamResponse>* GenerateStream(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* req,
                                     v1::TokenizeResponse* resp) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx,
                                      const v1::ModelInfoRequest* req,
                                      v1::ModelInfoResponse* resp) override;
  grpc::ServerUnaryReactor* CacheStats(grpc::CallbackServerContext* ctx,
                                       const v1::CacheStatsRequest* req,
                                       v1::CacheStatsResponse* resp) override;

  // Validates `req` and queues it for `sink`; the sink hears on_finish iff this returns OK.
  absl::Status submit(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req,
                      RequestSink* sink, std::shared_ptr<Request>* out);
  ServerMetrics& metrics() { return metrics_; }

 private:
  const Model& model_;
  const cache::KvCache& cache_;
  Scheduler& scheduler_;
  ServerMetrics& metrics_;
  const ServiceInfo info_;
  std::atomic<uint64_t> next_seed_{0x5eed};
};

}  // namespace fpa::server
