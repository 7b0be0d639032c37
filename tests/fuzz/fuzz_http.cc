// Raw bytes from a client -> the HTTP/1.1 reader of every connection
// (server/http/http_request_reader.h): the Beast parser with the server's limits, headers, bodies
// (chunked too), trailers and pipelined requests, read the way http::Connection reads them (the
// same Beast read operations, on a stream that hands out the input in pieces instead of a
// socket). Each input is read twice: with the server's limits, and with tight ones that 4 KiB
// inputs can exceed. Nothing may throw or crash; every request let through must be within the
// limits, every refusal a 400/413/414/431.
// TODO(issue 22): the response side (the disconnect watch's hang-up and half-close probe, streamed
// writes) follows socket events rather than bytes; server_unit and server_http_hostile cover it.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/http/read.hpp>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/http/http_request_reader.h"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using fpa::server::http::Limits;
using fpa::server::http::RequestReader;
using Next = RequestReader::Next;

// A SyncReadStream over the input: at most `piece` bytes a read (so that every parser state is
// entered at a read boundary too), then the end of the stream.
class ByteStream {
 public:
  ByteStream(std::string_view bytes, size_t piece) : bytes_(bytes), piece_(piece) {}

  template <typename Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& ec) {
    if (bytes_.empty()) {
      ec = asio::error::eof;
      return 0;
    }
    size_t n =
        asio::buffer_copy(buffers, asio::buffer(bytes_.data(), std::min(piece_, bytes_.size())));
    bytes_.remove_prefix(n);
    ec = {};
    return n;
  }
  template <typename Buffers>
  size_t read_some(const Buffers& buffers) {
    beast::error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }

 private:
  std::string_view bytes_;
  size_t piece_;
};

void check_refusal(bhttp::status status) {
  using S = bhttp::status;
  if (status != S::bad_request && status != S::payload_too_large && status != S::uri_too_long &&
      status != S::request_header_fields_too_large) {
    std::abort();
  }
}

void check_request(const fpa::server::http::Request& r, const Limits& limits) {
  if (r.method.size() + r.target.size() + 10 > limits.max_request_line) std::abort();
  if (r.body.size() > limits.max_body_bytes) std::abort();
}

// One connection's requests, as Connection::read_header / on_read / dispatch / watch_disconnect
// take them, until a refusal, a close, or a request that does not keep the connection alive.
void serve(std::string_view bytes, size_t piece, const Limits& limits) {
  ByteStream stream(bytes, piece);
  RequestReader reader(limits);
  while (true) {
    beast::error_code ec;
    bhttp::read_header(stream, reader.buffer(), reader.next(), ec);
    RequestReader::Step step = reader.after_header(ec);
    if (step.next == Next::kReadBody || step.next == Next::kContinue) {
      bhttp::read(stream, reader.buffer(), reader.parser(), ec);
      step = reader.after_body(ec);
    }
    if (step.next == Next::kReject) return check_refusal(step.status);
    if (step.next == Next::kClose) return;
    RequestReader::Parsed parsed = reader.take();
    check_request(parsed.request, limits);
    if (!parsed.keep_alive) return;
    // While the response is pending, pipelined bytes are read into the request buffer.
    size_t room = reader.room(piece);
    if (room == 0) continue;
    size_t n = stream.read_some(reader.buffer().prepare(room), ec);
    if (ec) return;
    reader.buffer().commit(n);
    if (reader.buffer().size() > reader.buffer().max_size()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte sets the read size; the rest is what the client sends.
  const size_t piece = data[0] == 0 ? 65536 : data[0];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  static const Limits server_limits;
  static const Limits tight = [] {
    Limits l;
    l.max_request_line = 64;
    l.max_header_bytes = 256;
    l.max_body_bytes = 512;
    return l;
  }();
  serve(bytes, piece, server_limits);
  serve(bytes, piece, tight);
  return 0;
}
