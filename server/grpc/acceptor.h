// Accepts the gRPC port's connections itself and hands each to grpc::Server
// (AddInsecureChannelFromFd). gRPC 1.51's own listener stops accepting for good after one
// accept4 fails (EMFILE); this one instead:
// - sheds connections beyond `max_connections` (accepted and closed at once, so the client fails
//   fast instead of waiting in the backlog);
// - when descriptors run out, closes a reserved descriptor to accept and shed every connection
//   waiting in the backlog, then backs off (10 ms doubling to 1 s) and retries, so it recovers
//   once descriptors free up;
// - closes connections that have not sent the HTTP/2 client preface within `handshake_timeout`,
//   and connections whose first bytes are not that preface.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "grpcpp/server.h"
#include "server/grpc/listen_socket.h"

namespace fpa::server {

struct AcceptorLimits {
  int max_connections = 1024;  // handshaking and established together
  std::chrono::milliseconds handshake_timeout{10000};
};

class Acceptor {
 public:
  Acceptor(ListenSocket socket, AcceptorLimits limits);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  int port() const { return port_; }
  // Starts the accepting thread; `server` must outlive stop().
  void start(grpc::Server* server);
  // Stops accepting and closes the listening socket and unfinished handshakes. Idempotent.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    int fd;
    Clock::time_point deadline;
    Clock::time_point next_check;  // a partial preface is not polled again until then
  };
  struct Handed {
    int fd;
    ino_t inode;  // gRPC closes the fd when the connection ends; the number may be reused
  };

  void run();
  void accept_ready(Clock::time_point now);
  void out_of_descriptors(Clock::time_point now);
  // True when the connection is settled (handed to gRPC or closed).
  bool check_handshake(Pending& p, Clock::time_point now);
  void hand_over(int fd);
  int live_connections();
  void note_shed(const char* why);

  const int listen_fd_;
  const int port_;
  const AcceptorLimits limits_;
  int reserve_fd_ = -1;
  grpc::Server* server_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::vector<Pending> pending_;
  std::vector<Handed> handed_;
  Clock::time_point resume_at_{};
  std::chrono::milliseconds backoff_{10};
  Clock::time_point last_log_{};
  int64_t shed_since_log_ = 0;
};

}  // namespace fpa::server
