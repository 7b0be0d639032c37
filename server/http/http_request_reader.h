// The byte-level half of an HTTP/1.1 connection, without the socket: the Beast parser held to the
// server's limits, the buffer that bounds what one request may hold unparsed (and keeps the
// bytes of pipelined requests), and what each read's outcome means: a request to dispatch, a
// body still to read, a 4xx answer, or a close. http::Connection drives it with async reads on
// its socket; tests/fuzz/fuzz_http.cc drives it with the same Beast reads on raw bytes.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it
// clang-format on
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <optional>
#include <string_view>

#include "server/http/http_server.h"

namespace fpa::server::http {

class RequestReader {
 public:
  using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

  enum class Next {
    kDispatch,  // a whole request: take() it
    kReadBody,  // the header is accepted: read the body with the same parser
    kContinue,  // as kReadBody, once "100 Continue" is sent (the client waits for it)
    kReject,    // answer `status` (with `why`) and close
    kClose,     // the client left, timed out or closed between requests
  };
  struct Step {
    Step(Next n, boost::beast::http::status s = {}, std::string_view w = {})  // NOLINT: {Next}
        : next(n), status(s), why(w) {}
    Next next;
    boost::beast::http::status status;  // kReject: the answer, and why
    std::string_view why;
  };
  // A request taken from the parser, and how to answer it.
  struct Parsed {
    Request request;
    bool keep_alive;
    unsigned version;
  };

  explicit RequestReader(const Limits& limits);

  // A fresh parser for the next request; bytes already buffered (pipelined) are kept.
  Parser& next();
  Parser& parser() { return *parser_; }
  boost::beast::flat_buffer& buffer() { return buffer_; }

  // What the outcome of reading the header (async_read_header) or the body (async_read) means.
  Step after_header(boost::beast::error_code ec) const;
  Step after_body(boost::beast::error_code ec) const;
  // The request of a kDispatch step; the parser is spent.
  Parsed take();
  // How many bytes may be read into the buffer while a response is pending, at most `chunk`: a
  // client that pipelines more than the buffer holds is not read further (back-pressure).
  size_t room(size_t chunk) const;

 private:
  size_t field_bytes() const;

  const Limits& limits_;
  boost::beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
};

}  // namespace fpa::server::http
