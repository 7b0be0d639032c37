// One HTTP/1.1 connection of http::HttpServer: reads requests within the limits, hands each to
// the handler as an Exchange, writes the response (whole or chunked), and watches the socket
// while a response is pending so that a client who hangs up is noticed before the next write.
// Everything here runs on the server's I/O thread.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it
// clang-format on
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http/http_request_reader.h"
#include "server/http/http_server.h"

namespace fpa::server::http {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `counter` counts the open connections of this kind; the connection holds one unit of it
  // (atomic: the last reference, and so the destructor, may be dropped on another thread).
  // `busy` counts the server's connections with a response in progress.
  // A connection over the server's cap is `refused`: it answers 503 and closes.
  Connection(boost::asio::ip::tcp::socket socket, const Limits& limits, const Handler& handler,
             std::atomic<int>* counter, std::atomic<int>* busy, bool refused);
  ~Connection();
  void start();

  // The response to exchange `id`; calls for an exchange that is over are ignored.
  void add_header(uint64_t id, std::string name, std::string value);
  void reply(uint64_t id, int status, std::string content_type, std::string body);
  void start_stream(uint64_t id, std::string content_type);
  void send(uint64_t id, std::string data);
  void end(uint64_t id);
  void set_on_disconnect(std::function<void()> f) { on_disconnect_ = std::move(f); }
  boost::asio::any_io_executor executor() { return stream_.get_executor(); }

 private:
  using Status = boost::beast::http::status;

  void read_header();
  void read_body();
  void on_read(RequestReader::Step step);
  void dispatch();
  void watch_disconnect();
  void peer_done_sending(uint64_t id);
  void watch_reset(uint64_t id);
  bool deferred(std::function<void()> f);
  void disconnected();
  void reject(Status status, std::string_view why);
  void linger();
  void write_next_chunk();
  void response_done();
  void close();
  void set_responding(bool responding);
  bool current(uint64_t id) const { return id == exchange_ && responding_ && !closed_; }

  boost::beast::tcp_stream stream_;
  const Limits& limits_;
  const Handler& handler_;
  std::atomic<int>* counter_;
  std::atomic<int>* busy_;
  bool refused_;
  RequestReader reader_;
  bool keep_alive_ = false;
  unsigned version_ = 11;
  uint64_t exchange_ = 0;  // id of the latest request handed out
  bool responding_ = false;
  bool closed_ = false;
  std::function<void()> on_disconnect_;
  bool replied_ = false;  // reply() is writing the response
  bool probing_ = false;  // writing the half-close probe
  std::vector<std::function<void()>> deferred_;
  std::vector<std::pair<std::string, std::string>> headers_;  // for the next response

  boost::beast::http::response<boost::beast::http::string_body> response_;
  std::optional<boost::beast::http::response<boost::beast::http::empty_body>> head_;
  std::optional<boost::beast::http::response_serializer<boost::beast::http::empty_body>> head_sr_;
  std::string pending_;  // chunk bytes waiting for the write in flight
  std::string writing_;  // the chunk being written
  bool write_in_flight_ = false;
  bool ending_ = false;
  std::array<char, 4096> discard_;
  size_t discarded_ = 0;
};

}  // namespace fpa::server::http
