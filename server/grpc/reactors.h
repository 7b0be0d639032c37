// The per-call objects of Generate and GenerateStream: each is a RequestSink fed by the
// scheduler thread and a gRPC reactor that answers the client. Both delete themselves when gRPC
// is done with the call (OnDone), which happens only after the scheduler's on_finish.
#pragma once

#include "proto/fpa/v1/fpa.grpc.pb.h"

namespace fpa::server {

class FpaServiceImpl;

// `req` holds an encoded GenerateRequest; `resp` receives an encoded GenerateResponse, and the
// stream encoded GenerateStreamResponses.
grpc::ServerUnaryReactor* start_unary_generate(FpaServiceImpl& service,
                                               grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer& req, grpc::ByteBuffer* resp);
grpc::ServerWriteReactor<grpc::ByteBuffer>* start_stream_generate(FpaServiceImpl& service,
                                                                  grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer& req);

}  // namespace fpa::server
