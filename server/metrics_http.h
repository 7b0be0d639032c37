// The HTTP endpoint serving GET /metrics in Prometheus' text format.
//
// prometheus-cpp's own Exposer runs on civetweb, whose threads ask for a fixed 100 KiB stack;
// once the CUDA libraries (large static TLS) are linked in, glibc refuses such threads and the
// Exposer cannot start. This endpoint keeps prometheus-cpp's registry and text serializer and
// answers over Boost.Beast on one thread with the default stack.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace fpa::server {

class MetricsHttpServer {
 public:
  // Listens on HOST:PORT (port 0 picks a free one) and serves until destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> start(
      const std::string& address, std::shared_ptr<prometheus::Collectable> metrics);
  virtual ~MetricsHttpServer() = default;
  virtual int port() const = 0;
};

}  // namespace fpa::server
