// Messages to and from gRPC's raw bytes. The service decodes every request itself, so that bytes
// which are no valid message (truncated, a string that is not UTF-8) get INVALID_ARGUMENT with a
// reason, where gRPC's generated handlers would answer UNIMPLEMENTED with none.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace fpa::server {

// The buffer's bytes, contiguous (gRPC caps a request at 4 MB).
std::string flatten(const grpc::ByteBuffer& buffer);

// InvalidArgument starting with "request:" when `bytes` do not parse as `out`'s type.
absl::Status decode(const std::string& bytes, google::protobuf::Message* out);
absl::Status decode(const grpc::ByteBuffer& buffer, google::protobuf::Message* out);

void encode(const google::protobuf::Message& msg, grpc::ByteBuffer* out);

grpc::Status to_grpc(const absl::Status& st);

}  // namespace fpa::server
