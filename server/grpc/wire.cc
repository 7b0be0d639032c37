#include "server/grpc/wire.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace fpa::server {

std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

absl::Status decode(const std::string& bytes, google::protobuf::Message* out) {
  // protobuf would log a line per bad string: a client could flood the log. The status says it.
  google::protobuf::LogSilencer quiet;
  if (out->ParseFromString(bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("request: ", bytes.size(), " bytes are not a valid ", out->GetTypeName(),
                   " (truncated, a wrong field type, or a string that is not UTF-8)"));
}

absl::Status decode(const grpc::ByteBuffer& buffer, google::protobuf::Message* out) {
  return decode(flatten(buffer), out);
}

void encode(const google::protobuf::Message& msg, grpc::ByteBuffer* out) {
  out->Clear();  // the serializer refuses a buffer that still holds a message
  bool own_buffer = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(msg, out, &own_buffer);
}

grpc::Status to_grpc(const absl::Status& st) {
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

}  // namespace fpa::server
