// fpa-health-probe: asks a gRPC server's grpc.health.v1.Health/Check for one service and exits
// 0 when it answers SERVING, 1 when it answers anything else, 2 when the call itself fails.
// Docker's HEALTHCHECK and Compose run it; Kubernetes uses its built-in gRPC probe instead.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "grpc_health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "gRPC address of the server (HOST:PORT)");
ABSL_FLAG(std::string, service, "fpa.v1.FpaService",
          "health service name to check (\"\" for the whole server)");
ABSL_FLAG(int, timeout_ms, 2000, "deadline of the Check call in milliseconds");

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

int Probe(const std::string& address, const std::string& service, int timeout_ms) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "health check of %s at %s failed: %s: %s\n", service.c_str(),
                 address.c_str(), std::to_string(status.error_code()).c_str(),
                 status.error_message().c_str());
    return 2;
  }
  const std::string name = HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("%s\n", name.c_str());
  return response.status() == HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Checks a gRPC health service; exit 0 = SERVING, 1 = not serving, 2 = call failed.");
  const auto positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "unexpected argument: %s (see --help)\n", positional[1]);
    return 64;
  }
  const int timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms <= 0) {
    std::fprintf(stderr, "--timeout_ms must be positive, got %d\n", timeout_ms);
    return 64;
  }
  return Probe(absl::GetFlag(FLAGS_address), absl::GetFlag(FLAGS_service), timeout_ms);
}
