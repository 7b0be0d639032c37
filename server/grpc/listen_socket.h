// A listening TCP socket for HOST:PORT ("0.0.0.0:50051", "[::1]:0", "localhost:0").
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace fpa::server {

struct ListenSocket {
  int fd = -1;  // non-blocking, close-on-exec; the caller owns it
  int port = 0;
};

// Port 0 picks a free one. Unavailable naming the address when nothing can be bound.
absl::StatusOr<ListenSocket> listen_tcp(const std::string& address, int backlog);

}  // namespace fpa::server
