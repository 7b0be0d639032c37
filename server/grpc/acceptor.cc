#include "server/grpc/acceptor.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "grpcpp/server_posix.h"

namespace fpa::server {
namespace {

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
constexpr std::chrono::milliseconds kMaxBackoff{1000};
constexpr std::chrono::milliseconds kPollTick{100};  // how soon stop() is noticed

int open_reserve() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Through the raw system call: ThreadSanitizer treats a descriptor number as memory, and gRPC
// closes a handed-over one inside libgrpc (not instrumented), so another thread's accept reusing
// the number would read as a race with this look, when telling such a reuse apart is its point.
ino_t inode_of(int fd) {
  struct stat st {};
  return ::syscall(SYS_fstat, fd, &st) == 0 ? st.st_ino : 0;
}

}  // namespace

Acceptor::Acceptor(ListenSocket socket, AcceptorLimits limits)
    : listen_fd_(socket.fd), port_(socket.port), limits_(limits), reserve_fd_(open_reserve()) {}

Acceptor::~Acceptor() {
  stop();
  ::close(listen_fd_);
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
}

void Acceptor::start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { run(); });
}

void Acceptor::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  for (const Pending& p : pending_) ::close(p.fd);
  pending_.clear();
}

void Acceptor::run() {
  std::vector<pollfd> fds;
  std::vector<size_t> polled;  // pending_ index of fds[i + 1]
  while (!stopping_) {
    Clock::time_point now = Clock::now();
    Clock::time_point wake = now + kPollTick;
    fds.assign(1, pollfd{listen_fd_, static_cast<short>(now >= resume_at_ ? POLLIN : 0), 0});
    if (now < resume_at_) wake = std::min(wake, resume_at_);
    polled.clear();
    for (size_t i = 0; i < pending_.size(); ++i) {
      wake = std::min(wake, std::max(pending_[i].deadline, now));
      if (now < pending_[i].next_check) {
        wake = std::min(wake, pending_[i].next_check);
        continue;
      }
      fds.push_back(pollfd{pending_[i].fd, POLLIN, 0});
      polled.push_back(i);
    }
    auto timeout = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(timeout, 0))) < 0) {
      continue;  // EINTR
    }
    now = Clock::now();
    std::vector<bool> ready(pending_.size(), false);
    for (size_t k = 0; k < polled.size(); ++k) ready[polled[k]] = fds[k + 1].revents != 0;
    // Handshakes first: accept_ready() appends to pending_.
    size_t kept = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      bool due = ready[i] || now >= pending_[i].deadline;
      if (!(due && check_handshake(pending_[i], now))) pending_[kept++] = pending_[i];
    }
    pending_.resize(kept);
    if (fds[0].revents & POLLIN) accept_ready(now);
  }
}

void Acceptor::accept_ready(Clock::time_point now) {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        out_of_descriptors(now);
        return;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      continue;  // ECONNABORTED, EINTR, EPROTO...: that connection only
    }
    backoff_ = std::chrono::milliseconds(10);
    if (live_connections() >= limits_.max_connections) {
      ::close(fd);
      note_shed("at --max-connections");
      continue;
    }
    pending_.push_back(Pending{fd, now + limits_.handshake_timeout, now});
  }
}

void Acceptor::out_of_descriptors(Clock::time_point now) {
  // The reserved descriptor makes room to accept the waiting clients one by one and close each
  // at once: the whole backlog learns now that the server is full, rather than one client per
  // back-off period while the others wait for their own timeouts.
  if (reserve_fd_ >= 0) {
    ::close(reserve_fd_);
    // Bounded: a client flood cannot hold the loop here (4096: Linux's default somaxconn).
    for (int i = 0; i < 4096; ++i) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      ::close(fd);
      note_shed("out of file descriptors");
    }
  }
  reserve_fd_ = open_reserve();
  resume_at_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
}

bool Acceptor::check_handshake(Pending& p, Clock::time_point now) {
  char buf[kPrefaceBytes];
  ssize_t n = ::recv(p.fd, buf, sizeof(buf), MSG_PEEK);
  if (n == static_cast<ssize_t>(kPrefaceBytes) && std::memcmp(buf, kPreface, n) == 0) {
    hand_over(p.fd);
    return true;
  }
  bool waiting = (n > 0 && std::memcmp(buf, kPreface, n) == 0) ||
                 (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  if (waiting && now < p.deadline) {
    p.next_check = now + std::chrono::milliseconds(20);
    return false;
  }
  ::close(p.fd);  // not HTTP/2, closed by the client, or too slow
  return true;
}

void Acceptor::hand_over(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  handed_.push_back(Handed{fd, inode_of(fd)});
  grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns fd from here on
}

int Acceptor::live_connections() {
  std::erase_if(handed_, [](const Handed& h) { return inode_of(h.fd) != h.inode; });
  return static_cast<int>(pending_.size() + handed_.size());
}

void Acceptor::note_shed(const char* why) {
  ++shed_since_log_;
  Clock::time_point now = Clock::now();
  if (now - last_log_ < std::chrono::seconds(10)) return;
  std::cerr << "fpa-serve: refused " << shed_since_log_ << " gRPC connection(s): " << why
            << std::endl;
  shed_since_log_ = 0;
  last_log_ = now;
}

}  // namespace fpa::server
