// A small HTTP/1.1 server (Boost.Beast, one I/O thread) shared by /metrics and the OpenAI API.
//
// It is hardened the way a public port must be: a cap on open connections (the next one gets a
// 503 and is closed), request line / header / body limits answered with 414 / 431 / 413 and a
// lingering close (the client reads the answer instead of a reset), a deadline for a whole
// request header and for a body, write deadlines for slow readers, a bound on the bytes queued
// for one streaming response, and an accept loop that backs off when the process runs out of
// file descriptors instead of spinning. Memory per connection is bounded by the limits below.
//
// prometheus-cpp's own Exposer runs on civetweb, whose threads ask for a fixed 100 KiB stack;
// once the CUDA libraries (large static TLS) are linked in, glibc refuses such threads. Beast
// runs on one thread with the default stack.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fpa::server::http {

struct Limits {
  int max_connections = 256;
  size_t max_request_line = 8 * 1024;               // longer: 414
  size_t max_header_bytes = 16 * 1024;              // all header fields: 431
  size_t max_body_bytes = 4 * 1024 * 1024;          // 413
  size_t max_pending_bytes = 4 * 1024 * 1024;       // queued for a client that does not read
  std::chrono::milliseconds header_timeout{15000};  // a whole header, or a keep-alive idle wait
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};  // each write
  // Runs on the I/O thread each time a connection is closed because handling it threw (each
  // is logged too); null: only logged.
  std::function<void()> on_failure;
};

struct Request {
  std::string method;
  std::string target;  // path and query, as sent
  std::string body;
  std::string authorization;  // the Authorization header, as sent
};

// One request and its response. Every method may be called from any thread; the I/O thread
// performs them in call order. A response is either reply() or start_stream(), send()..., end().
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const Request& request() const = 0;
  // A header for the response, set before reply() or start_stream().
  virtual void add_header(std::string name, std::string value) = 0;
  virtual void reply(int status, std::string_view content_type, std::string body) = 0;
  // Status 200 with chunked transfer encoding; each send() is one chunk.
  virtual void start_stream(std::string_view content_type) = 0;
  virtual void send(std::string data) = 0;
  virtual void end() = 0;
  // `f` runs once on the I/O thread if the client disconnects (or stops reading) before the
  // response is complete. Set it inside the handler call, before handing the exchange on.
  virtual void on_disconnect(std::function<void()> f) = 0;
};

// Called on the I/O thread for every complete request; must not block.
using Handler = std::function<void(std::shared_ptr<Exchange>)>;

class HttpServer {
 public:
  // Listens on HOST:PORT (port 0 picks a free one) and serves until destroyed. Exchanges still
  // held by others must be released before the server is destroyed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> start(const std::string& address,
                                                           Limits limits, Handler handler);
  virtual ~HttpServer() = default;
  virtual int port() const = 0;
};

}  // namespace fpa::server::http
