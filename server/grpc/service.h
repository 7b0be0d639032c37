// The gRPC service fpa.v1.FpaService (callback API). It only validates, hands requests to the
// scheduler and streams back what the scheduler reports; it never touches the model runner.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "cache/kv_cache.h"
#include "kernels/cpu/formats.h"
#include "model/model.h"
#include "proto/fpa/v1/fpa.grpc.pb.h"
#include "server/metrics/metrics.h"
#include "server/request/validate.h"
#include "server/scheduler/scheduler.h"

namespace fpa::server {

struct ServiceInfo {
  std::string backend;
  CpuFormats formats;  // the CPU backend's, "auto" resolved; empty on CUDA
  RequestLimits limits;
  int max_batch = 0;
};

// Every method takes raw bytes and decodes them itself (server/grpc/wire.h), so that no request can
// end without a status the service chose.
using RawFpaService = v1::FpaService::WithRawCallbackMethod_Generate<
    v1::FpaService::WithRawCallbackMethod_GenerateStream<
        v1::FpaService::WithRawCallbackMethod_Tokenize<
            v1::FpaService::WithRawCallbackMethod_ModelInfo<
                v1::FpaService::WithRawCallbackMethod_CacheStats<v1::FpaService::Service>>>>>;

class FpaServiceImpl final : public RawFpaService {
 public:
  FpaServiceImpl(const Model& model, const cache::KvCache& cache, Scheduler& scheduler,
                 ServerMetrics& metrics, ServiceInfo info);

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* CacheStats(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;

  // Decodes and validates `req` and queues it for `sink`; the sink hears on_finish iff this
  // returns OK.
  absl::Status submit(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& req,
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
