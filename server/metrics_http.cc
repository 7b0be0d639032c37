#include "server/metrics_http.h"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace fpa::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// One keep-alive connection: read a request, answer it, repeat until the client closes.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<prometheus::Collectable> metrics)
      : stream_(std::move(socket)), metrics_(std::move(metrics)) {}

  void read() {
    request_ = {};
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->answer();
                     });
  }

 private:
  void answer() {
    response_ = {};
    response_.version(request_.version());
    response_.keep_alive(request_.keep_alive());
    if (request_.method() != http::verb::get) {
      response_.result(http::status::method_not_allowed);
      response_.body() = "only GET\n";
    } else if (request_.target() != "/metrics") {
      response_.result(http::status::not_found);
      response_.body() = "see /metrics\n";
    } else {
      response_.result(http::status::ok);
      response_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response_.body() = prometheus::TextSerializer().Serialize(metrics_->Collect());
    }
    response_.prepare_payload();
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return;
                        if (self->response_.keep_alive()) {
                          self->read();
                        } else {
                          self->stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
                        }
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
  std::shared_ptr<prometheus::Collectable> metrics_;
};

class BeastMetricsServer final : public MetricsHttpServer {
 public:
  BeastMetricsServer(tcp::endpoint endpoint, std::shared_ptr<prometheus::Collectable> metrics)
      : acceptor_(io_, endpoint), metrics_(std::move(metrics)) {
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~BeastMetricsServer() override {
    io_.stop();
    thread_.join();
  }
  int port() const override { return acceptor_.local_endpoint().port(); }

 private:
  void accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (!ec) std::make_shared<Session>(std::move(socket), metrics_)->read();
      accept();
    });
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> metrics) {
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad metrics address '", address, "' (expected HOST:PORT)"));
  }
  std::string host = address.substr(0, colon);
  beast::error_code ec;
  asio::ip::address ip = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad metrics host '", host, "'"));
  try {
    return std::make_unique<BeastMetricsServer>(
        tcp::endpoint(ip, static_cast<unsigned short>(port)), std::move(metrics));
  } catch (const boost::system::system_error& e) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", e.what()));
  }
}

}  // namespace fpa::server
