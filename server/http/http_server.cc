#include "server/http/http_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <exception>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/http_connection.h"

namespace fpa::server::http {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr std::chrono::milliseconds kMaxBackoff{1000};
constexpr std::chrono::seconds kShutdownGrace{2};

// Errors that say "no resources now" rather than "this connection failed": accepting again at
// once would fail the same way, so the loop waits (the pending connections stay in the backlog).
bool out_of_resources(const boost::system::error_code& ec) {
  if (ec.category() != boost::system::system_category()) return false;
  int e = ec.value();
  return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

class BeastServer final : public HttpServer {
 public:
  BeastServer(tcp::endpoint endpoint, Limits limits, Handler handler)
      : limits_(limits), handler_(std::move(handler)), acceptor_(io_, endpoint), backoff_(io_) {
    accept();
    thread_ = std::thread([this] { run(); });
  }
  // Stops accepting, lets responses in progress (a drained request's last events) reach their
  // clients for up to kShutdownGrace, then stops.
  ~BeastServer() override {
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
    while (busy_ > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    io_.stop();
    thread_.join();
  }
  int port() const override { return acceptor_.local_endpoint().port(); }

 private:
  // No exception may leave the I/O thread: it would end the process. One thrown from a
  // connection's handler unwinds that handler, which drops the connection's last reference
  // and so closes it; the loop goes on serving the others.
  void run() {
    while (true) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        if (limits_.on_failure) limits_.on_failure();
        std::cerr << "fpa-serve: http: connection closed on an exception: " << e.what()
                  << std::endl;
      }
    }
  }

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (out_of_resources(ec)) return back_off();
      delay_ = kFirstBackoff;
      if (!ec) admit(std::move(socket));
      accept();
    });
  }

  void back_off() {
    backoff_.expires_after(delay_);
    delay_ = std::min(delay_ * 2, kMaxBackoff);
    backoff_.async_wait([this](boost::system::error_code ec) {
      if (!ec) accept();
    });
  }

  // Past the cap a connection is answered 503 and closed; past twice the cap (a flood) it is
  // closed at once, so that refusals cannot hold unbounded memory either.
  void admit(tcp::socket socket) {
    if (served_ < limits_.max_connections) {
      std::make_shared<Connection>(std::move(socket), limits_, handler_, &served_, &busy_, false)
          ->start();
    } else if (refused_ < limits_.max_connections) {
      std::make_shared<Connection>(std::move(socket), limits_, handler_, &refused_, &busy_, true)
          ->start();
    }
  }

  // Connections point at these; they are destroyed with io_, so these are declared before it.
  const Limits limits_;
  const Handler handler_;
  std::atomic<int> served_{0};
  std::atomic<int> refused_{0};
  std::atomic<int> busy_{0};
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer backoff_;
  std::chrono::milliseconds delay_ = kFirstBackoff;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& address,
                                                              Limits limits, Handler handler) {
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad address '", address, "' (expected HOST:PORT)"));
  }
  std::string host = address.substr(0, colon);
  boost::system::error_code ec;
  asio::ip::address ip = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad host '", host, "'"));
  try {
    return std::make_unique<BeastServer>(tcp::endpoint(ip, static_cast<unsigned short>(port)),
                                         limits, std::move(handler));
  } catch (const boost::system::system_error& e) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", e.what()));
  }
}

}  // namespace fpa::server::http
