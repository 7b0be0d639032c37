#include "server/http/http_request_reader.h"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <string>

namespace fpa::server::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
using Status = bhttp::status;
using Next = RequestReader::Next;

bool is_parse_error(const beast::error_code& ec) {
  return ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category();
}

}  // namespace

RequestReader::RequestReader(const Limits& limits)
    : limits_(limits),
      // Bounds what one request may hold unparsed: a header (414/431 come first), a chunk
      // header, or a trailer, which Beast does not count against the header limit and whose
      // field container throws past 64 KiB.
      buffer_(limits.max_request_line + limits.max_header_bytes) {}

RequestReader::Parser& RequestReader::next() {
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(limits_.max_request_line + limits_.max_header_bytes));
  parser_->body_limit(limits_.max_body_bytes);
  return *parser_;
}

// Bytes of the header fields as sent: "Name: value\r\n" each.
size_t RequestReader::field_bytes() const {
  size_t n = 0;
  for (const auto& f : parser_->get()) n += f.name_string().size() + f.value().size() + 4;
  return n;
}

// The parser reads at most a request line and the fields together (its one limit); each part is
// then held to its own. Beast consumes the request line once parsed, and only then sets the
// target: a limit hit without one is the line's.
RequestReader::Step RequestReader::after_header(beast::error_code ec) const {
  if (ec == bhttp::error::header_limit) {
    return parser_->get().target().empty()
               ? Step{Next::kReject, Status::uri_too_long, "request line too long"}
               : Step{Next::kReject, Status::request_header_fields_too_large,
                      "header fields too large"};
  }
  if (ec == bhttp::error::body_limit) {
    return {Next::kReject, Status::payload_too_large, "body too large"};
  }
  if (is_parse_error(ec)) return {Next::kReject, Status::bad_request, "malformed request"};
  if (ec) return {Next::kClose};
  const auto& req = parser_->get();
  // "METHOD SP target SP HTTP/1.1": a line that fit only because the headers were short.
  if (req.method_string().size() + req.target().size() + 10 > limits_.max_request_line) {
    return {Next::kReject, Status::uri_too_long, "request line too long"};
  }
  if (field_bytes() > limits_.max_header_bytes) {
    return {Next::kReject, Status::request_header_fields_too_large, "header fields too large"};
  }
  if (parser_->is_done()) return {Next::kDispatch};
  // curl asks before sending a body over 1 KiB, and waits a second for the answer otherwise.
  if (beast::iequals(req[bhttp::field::expect], "100-continue")) return {Next::kContinue};
  return {Next::kReadBody};
}

RequestReader::Step RequestReader::after_body(beast::error_code ec) const {
  if (ec == bhttp::error::body_limit) {
    return {Next::kReject, Status::payload_too_large, "body too large"};
  }
  if (ec == bhttp::error::buffer_overflow) {
    return {Next::kReject, Status::request_header_fields_too_large, "trailer fields too large"};
  }
  if (is_parse_error(ec)) return {Next::kReject, Status::bad_request, "malformed body"};
  if (ec) return {Next::kClose};
  return {Next::kDispatch};
}

RequestReader::Parsed RequestReader::take() {
  auto& req = parser_->get();
  Parsed p{{std::string(req.method_string()), std::string(req.target()), std::move(req.body()),
            std::string(req[bhttp::field::authorization])},
           req.keep_alive(),
           req.version()};
  parser_.reset();
  return p;
}

size_t RequestReader::room(size_t chunk) const {
  return std::min(chunk, buffer_.max_size() - buffer_.size());
}

}  // namespace fpa::server::http
