// The per-call objects of Generate and GenerateStream: each is a RequestSink fed by the
// scheduler thread and a gRPC reactor that answers the client. Both delete themselves when gRPC
// is done with the call (OnDone), which happens only after the scheduler's on_finish.
#pragma once

#include "proto/fpa/v1/fpa.grpc.pb.h"

namespace fpa::server {

class FpaServiceImpl;

grpc::ServerUnaryReactor* start_unary_generate(FpaServiceImpl& service,
                                               grpc::CallbackServerContext* ctx,
                                               const v1::GenerateRequest& req,
                                               v1::GenerateResponse* resp);
grpc::ServerWriteReactor<v1::GenerateStreamResponse>* start_stream_generate(
    FpaServiceImpl& service, grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req);

}  // namespace fpa::server
