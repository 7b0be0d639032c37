#include "server/http/http_connection.h"

#include <algorithm>
#include <utility>

namespace fpa::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

// A refused or rejected client gets this long to finish sending before the socket closes, and
// this many of its bytes are read and dropped: enough for it to see the answer, not a reset.
constexpr std::chrono::seconds kLinger{2};
constexpr size_t kMaxDiscard = 64 * 1024 * 1024;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// The Exchange handed to handlers: posts every call to the connection's I/O thread, in order.
class ConnectionExchange final : public Exchange {
 public:
  ConnectionExchange(std::shared_ptr<Connection> c, uint64_t id, Request r)
      : conn_(std::move(c)), id_(id), request_(std::move(r)) {}

  const Request& request() const override { return request_; }
  void add_header(std::string name, std::string value) override {
    post([n = std::move(name), v = std::move(value)](Connection& c, uint64_t id) mutable {
      c.add_header(id, std::move(n), std::move(v));
    });
  }
  void reply(int status, std::string_view content_type, std::string body) override {
    post([status, ct = std::string(content_type), b = std::move(body)](Connection& c,
                                                                       uint64_t id) mutable {
      c.reply(id, status, std::move(ct), std::move(b));
    });
  }
  void start_stream(std::string_view content_type) override {
    post([ct = std::string(content_type)](Connection& c, uint64_t id) mutable {
      c.start_stream(id, std::move(ct));
    });
  }
  void send(std::string data) override {
    post([d = std::move(data)](Connection& c, uint64_t id) mutable { c.send(id, std::move(d)); });
  }
  void end() override {
    post([](Connection& c, uint64_t id) { c.end(id); });
  }
  void on_disconnect(std::function<void()> f) override { conn_->set_on_disconnect(std::move(f)); }

 private:
  template <typename F>
  void post(F f) {
    asio::post(conn_->executor(), [c = conn_, id = id_, f = std::move(f)]() mutable { f(*c, id); });
  }

  std::shared_ptr<Connection> conn_;
  uint64_t id_;
  Request request_;
};

}  // namespace

Connection::Connection(tcp::socket socket, const Limits& limits, const Handler& handler,
                       std::atomic<int>* counter, std::atomic<int>* busy, bool refused)
    : stream_(std::move(socket)),
      limits_(limits),
      handler_(handler),
      counter_(counter),
      busy_(busy),
      refused_(refused),
      reader_(limits) {
  ++*counter_;
}

Connection::~Connection() {
  set_responding(false);
  --*counter_;
}

void Connection::set_responding(bool responding) {
  if (responding != responding_) *busy_ += responding ? 1 : -1;
  responding_ = responding;
}

void Connection::start() {
  if (refused_) return reject(Status::service_unavailable, "too many connections");
  read_header();
}

void Connection::read_header() {
  stream_.expires_after(limits_.header_timeout);
  bhttp::async_read_header(stream_, reader_.buffer(), reader_.next(),
                           [self = shared_from_this()](beast::error_code ec, size_t) {
                             self->on_read(self->reader_.after_header(ec));
                           });
}

void Connection::read_body() {
  stream_.expires_after(limits_.body_timeout);
  bhttp::async_read(stream_, reader_.buffer(), reader_.parser(),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      self->on_read(self->reader_.after_body(ec));
                    });
}

void Connection::on_read(RequestReader::Step step) {
  using Next = RequestReader::Next;
  switch (step.next) {
    case Next::kDispatch:
      return dispatch();
    case Next::kReadBody:
      return read_body();
    case Next::kContinue:
      stream_.expires_after(limits_.write_timeout);
      return asio::async_write(stream_, asio::buffer(kContinue),
                               [self = shared_from_this()](beast::error_code ec, size_t) {
                                 if (ec) return self->close();
                                 self->read_body();
                               });
    case Next::kReject:
      return reject(step.status, step.why);
    case Next::kClose:
      return close();
  }
}

void Connection::dispatch() {
  RequestReader::Parsed parsed = reader_.take();
  keep_alive_ = parsed.keep_alive;
  version_ = parsed.version;
  stream_.expires_never();  // a generation may take minutes; disconnects are watched instead
  set_responding(true);
  auto exchange = std::make_shared<ConnectionExchange>(shared_from_this(), ++exchange_,
                                                       std::move(parsed.request));
  watch_disconnect();
  // The server's run loop logs and counts the exception; closing here ends the disconnect
  // watch, which would otherwise keep this connection open with no one to answer it.
  try {
    handler_(std::move(exchange));
  } catch (...) {
    close();
    throw;
  }
}

// While a response is pending the socket is read into the request buffer: bytes are the
// client's next (pipelined) request, kept for read_header(); an error is a hang-up; the end of
// the stream is either a hang-up or a half-close (the client is done sending but still reads).
// With no room left the watch stops; a hang-up then shows when the response is written.
void Connection::watch_disconnect() {
  size_t room = reader_.room(discard_.size());
  if (room == 0) return;
  stream_.socket().async_read_some(
      reader_.buffer().prepare(room),
      [self = shared_from_this(), id = exchange_](beast::error_code ec, size_t n) {
        self->reader_.buffer().commit(n);
        if (!self->current(id) || ec == asio::error::operation_aborted) return;
        if (ec == asio::error::eof) return self->peer_done_sending(id);
        if (ec) return self->disconnected();
        self->watch_disconnect();
      });
}

// A closed peer and a half-closed one look the same until something is sent: a full close
// answers it with a reset. An HTTP/1.1 client must accept an interim 1xx response before the
// final one, so "100 Continue" is the probe. HTTP/1.0 has no 1xx, and a started stream is past
// them: their end of stream is taken for a hang-up, so that a stalled stream is still cancelled.
void Connection::peer_done_sending(uint64_t id) {
  keep_alive_ = false;   // no further request can come
  if (replied_) return;  // the answer is being written: its write tells a hang-up
  if (version_ < 11 || head_) return disconnected();
  probing_ = true;
  stream_.expires_after(limits_.write_timeout);
  asio::async_write(stream_, asio::buffer(kContinue),
                    [self = shared_from_this(), id](beast::error_code ec, size_t) {
                      self->probing_ = false;
                      if (!self->current(id)) return;
                      if (ec) return self->disconnected();
                      self->stream_.expires_never();
                      self->watch_reset(id);
                      for (auto& f : std::exchange(self->deferred_, {})) f();
                    });
}

// Completes when the probe's reset arrives (a half-closed peer sends none); the response's
// completion cancels it.
void Connection::watch_reset(uint64_t id) {
  stream_.socket().async_wait(tcp::socket::wait_error,
                              [self = shared_from_this(), id](beast::error_code ec) {
                                if (ec || !self->current(id)) return;
                                self->disconnected();
                              });
}

// Calls made while the probe is being written wait for it: one write at a time.
bool Connection::deferred(std::function<void()> f) {
  if (!probing_) return false;
  deferred_.push_back(std::move(f));
  return true;
}

void Connection::disconnected() {
  std::function<void()> f = std::move(on_disconnect_);
  on_disconnect_ = nullptr;
  close();
  if (f) f();
}

void Connection::add_header(uint64_t id, std::string name, std::string value) {
  if (current(id) && !head_) headers_.emplace_back(std::move(name), std::move(value));
}

void Connection::reply(uint64_t id, int status, std::string content_type, std::string body) {
  if (deferred([self = shared_from_this(), id, status, content_type, body] {
        self->reply(id, status, content_type, body);
      })) {
    return;
  }
  if (!current(id) || head_ || replied_) return;
  replied_ = true;
  response_ = {};
  response_.version(version_);
  response_.result(static_cast<unsigned>(status));
  response_.keep_alive(keep_alive_);
  response_.set(bhttp::field::content_type, content_type);
  for (auto& [name, value] : std::exchange(headers_, {})) response_.set(name, value);
  response_.body() = std::move(body);
  response_.prepare_payload();
  stream_.expires_after(limits_.write_timeout);
  bhttp::async_write(stream_, response_, [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->disconnected();
    self->response_done();
  });
}

void Connection::start_stream(uint64_t id, std::string content_type) {
  if (deferred(
          [self = shared_from_this(), id, content_type] { self->start_stream(id, content_type); }))
    return;
  if (!current(id) || head_) return;
  head_.emplace(bhttp::status::ok, version_);
  head_->set(bhttp::field::content_type, content_type);
  head_->set(bhttp::field::cache_control, "no-cache");
  for (auto& [name, value] : std::exchange(headers_, {})) head_->set(name, value);
  // HTTP/1.0 has no chunks: the body runs until the connection closes.
  if (version_ < 11) keep_alive_ = false;
  head_->keep_alive(keep_alive_);
  head_->chunked(version_ >= 11);
  head_sr_.emplace(*head_);
  write_in_flight_ = true;
  stream_.expires_after(limits_.write_timeout);
  bhttp::async_write_header(stream_, *head_sr_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->disconnected();
                              self->write_in_flight_ = false;
                              self->write_next_chunk();
                            });
}

void Connection::send(uint64_t id, std::string data) {
  if (deferred([self = shared_from_this(), id, data] { self->send(id, data); })) return;
  if (!current(id) || !head_ || ending_) return;
  pending_ += data;
  // Bounded memory: a client this far behind is treated as gone.
  if (pending_.size() > limits_.max_pending_bytes) return disconnected();
  if (!write_in_flight_) write_next_chunk();
}

void Connection::end(uint64_t id) {
  if (deferred([id, self = shared_from_this()] { self->end(id); })) return;
  if (!current(id) || !head_) return;
  ending_ = true;
  if (!write_in_flight_) write_next_chunk();
}

void Connection::write_next_chunk() {
  auto self = shared_from_this();
  auto next = [self](beast::error_code ec, size_t) {
    if (ec) return self->disconnected();
    self->write_in_flight_ = false;
    self->write_next_chunk();
  };
  stream_.expires_after(limits_.write_timeout);
  if (!pending_.empty()) {
    writing_ = std::exchange(pending_, {});
    write_in_flight_ = true;
    if (!head_->chunked()) return asio::async_write(stream_, asio::buffer(writing_), next);
    return asio::async_write(stream_, bhttp::make_chunk(asio::buffer(writing_)), next);
  }
  if (!ending_) return stream_.expires_never();
  ending_ = false;
  if (!head_->chunked()) return response_done();
  write_in_flight_ = true;
  asio::async_write(stream_, bhttp::make_chunk_last(), [self](beast::error_code ec, size_t) {
    self->write_in_flight_ = false;
    if (ec) return self->disconnected();
    self->response_done();
  });
}

void Connection::response_done() {
  set_responding(false);
  on_disconnect_ = nullptr;
  replied_ = false;
  head_sr_.reset();
  head_.reset();
  beast::error_code ec;
  stream_.socket().cancel(ec);  // the disconnect watch
  // Posted: the watch's handler, queued by the cancel (or earlier, with bytes), commits what
  // it read into the request buffer before the next read uses it.
  if (keep_alive_)
    return asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->closed_) self->read_header();
    });
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  close();
}

void Connection::reject(Status status, std::string_view why) {
  set_responding(false);
  response_ = {};
  response_.version(11);
  response_.result(status);
  response_.keep_alive(false);
  response_.set(bhttp::field::content_type, "text/plain; charset=utf-8");
  response_.body() = std::string(why) + "\n";
  response_.prepare_payload();
  stream_.expires_after(limits_.write_timeout);
  bhttp::async_write(stream_, response_, [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->close();
    self->linger();
  });
}

// After an early answer the client may still be sending: read and drop its bytes for a while,
// so that closing with unread data does not reset the connection under the answer.
void Connection::linger() {
  if (discarded_ == 0) {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(kLinger);
  }
  stream_.async_read_some(asio::buffer(discard_),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            self->discarded_ += std::max<size_t>(n, 1);
                            if (ec || self->discarded_ > kMaxDiscard) return self->close();
                            self->linger();
                          });
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  set_responding(false);
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
}

}  // namespace fpa::server::http
