#include "serve/http/request_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>

namespace afd::serve::http {

namespace beast_http = boost::beast::http;
using boost::beast::error_code;
using boost::beast::string_view;

namespace {

std::string sv(string_view s) { return std::string(s.data(), s.size()); }

// Transfer-Encoding values this server decodes: exactly "chunked" (any case, optional
// surrounding whitespace). Anything else (gzip, a list) is refused rather than passed on
// undecoded or mis-framed.
bool is_plain_chunked(string_view v) {
  size_t b = 0, e = v.size();
  while (b < e && (v[b] == ' ' || v[b] == '\t')) ++b;
  while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t')) --e;
  return iequals(std::string_view(v.data() + b, e - b), "chunked");
}

bool method_needs_length(const std::string& m) { return m == "POST" || m == "PUT" || m == "PATCH"; }

}  // namespace

// One request: Beast's HTTP/1 request parser, its callbacks building a Request and checking
// the limits Beast does not know (target length, header count, what a body must declare).
class RequestReader::Parser final : public beast_http::basic_parser<true> {
 public:
  explicit Parser(const Limits& l) : limits_(l) {
    header_limit(static_cast<std::uint32_t>(
        std::min<size_t>(l.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
    body_limit(static_cast<std::uint64_t>(l.max_body_bytes));
    // One parse step per put() (header, body piece, chunk-size line, last chunk + trailer),
    // so that next() can count the bytes of each and apply the size limits to exactly the
    // same bytes however the input was split.
    eager(false);
  }

  Request req;
  bool line_done = false;
  bool expect_continue = false;
  bool continue_sent = false;
  size_t header_bytes = 0;     // request line + fields consumed so far
  bool chunk_header = false;   // the last put() parsed a chunk-size line or the last chunk
  // Set by a callback that refused the request (with a Beast error code to stop parsing).
  int refusal_status = 0;
  std::string refusal;

 private:
  void refuse(int status, std::string msg, error_code& ec) {
    refusal_status = status;
    refusal = std::move(msg);
    ec = beast_http::error::bad_value;
  }

  void on_request_impl(beast_http::verb, string_view method, string_view target, int version,
                       error_code& ec) override {
    line_done = true;
    if (target.size() > limits_.max_target_bytes)
      return refuse(414, "request target longer than " + std::to_string(limits_.max_target_bytes) +
                             " bytes (--http-max-target)", ec);
    req.method = sv(method);
    req.target = sv(target);
    const size_t q = req.target.find('?');
    req.path = q == std::string::npos ? req.target : req.target.substr(0, q);
    req.version = version;
  }

  void on_response_impl(int, string_view, int, error_code& ec) override { ec = beast_http::error::bad_method; }

  void on_field_impl(beast_http::field f, string_view name, string_view value, error_code& ec) override {
    if (static_cast<int>(req.headers.size()) >= limits_.max_headers)
      return refuse(431, "more than " + std::to_string(limits_.max_headers) + " header fields (--http-max-headers)",
                    ec);
    if (f == beast_http::field::transfer_encoding) {
      if (!is_plain_chunked(value))
        return refuse(501, "unsupported Transfer-Encoding '" + sv(value).substr(0, 64) +
                               "' (only 'chunked' is accepted)", ec);
      chunked_ = true;
    } else if (f == beast_http::field::content_length) {
      has_length_ = true;
    } else if (f == beast_http::field::expect) {
      expect_continue = iequals(std::string_view(value.data(), value.size()), "100-continue");
    }
    req.headers.emplace_back(sv(name), sv(value));
  }

  void on_header_impl(error_code& ec) override {
    req.keep_alive = keep_alive();
    if (method_needs_length(req.method) && !has_length_ && !chunked_)
      return refuse(411, req.method + " without Content-Length or Transfer-Encoding: chunked", ec);
  }

  void on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code&) override {
    // Grow with what arrives; a declared length reserves at most 64 KiB up front, so that a
    // client announcing a large body and sending nothing costs nothing.
    if (length) req.body.reserve(static_cast<size_t>(std::min<std::uint64_t>(*length, 64 << 10)));
  }

  size_t on_body_impl(string_view body, error_code&) override {
    req.body.append(body.data(), body.size());
    return body.size();
  }

  void on_chunk_header_impl(std::uint64_t, string_view, error_code&) override { chunk_header = true; }

  size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code&) override {
    req.body.append(body.data(), body.size());
    return body.size();
  }

  void on_finish_impl(error_code&) override {}

  const Limits& limits_;
  bool chunked_ = false;
  bool has_length_ = false;
};

RequestReader::RequestReader(const Limits& limits) : limits_(limits) {}
RequestReader::~RequestReader() = default;

void RequestReader::compact() {
  if (start_ == 0) return;
  buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(start_));
  start_ = 0;
}

char* RequestReader::prepare(size_t n) {
  compact();
  prepared_at_ = buf_.size();
  buf_.resize(prepared_at_ + n);
  return buf_.data() + prepared_at_;
}

void RequestReader::commit(size_t n) {
  // prepare(m) grew the buffer by m at prepared_at_; keep the n bytes that were filled.
  buf_.resize(std::min(buf_.size(), prepared_at_ + n));
}

void RequestReader::append(const char* data, size_t n) {
  compact();
  buf_.insert(buf_.end(), data, data + n);
}

bool RequestReader::idle() const { return !parser_ && start_ == buf_.size(); }

bool RequestReader::header_done() const { return parser_ && parser_->is_header_done(); }

void RequestReader::release_memory() {
  compact();
  if (buf_.empty()) {
    std::vector<char>().swap(buf_);
  } else if (buf_.capacity() > 4 * std::max<size_t>(buf_.size(), 16 << 10)) {
    buf_.shrink_to_fit();
  }
}

void RequestReader::discard() {
  parser_.reset();
  ready_.reset();
  std::vector<char>().swap(buf_);
  start_ = prepared_at_ = 0;
}

std::string RequestReader::chunk_limit_message() const {
  return "chunk-size line or trailer section longer than " + std::to_string(limits_.max_header_bytes) +
         " bytes (--http-max-header-bytes)";
}

void RequestReader::fail(int status, std::string message) {
  failed_ = true;
  error_.status = status;
  error_.message = std::move(message);
  parser_.reset();
}

Request RequestReader::take() {
  Request r = ready_ ? std::move(*ready_) : Request{};
  ready_.reset();
  return r;
}

RequestReader::Event RequestReader::next() {
  if (failed_) return Event::error;
  if (ready_) return Event::request;
  if (!parser_) {
    // Empty lines before a request-line are ignored (RFC 9112 section 2.2).
    while (start_ < buf_.size() && (buf_[start_] == '\r' || buf_[start_] == '\n')) ++start_;
    if (start_ == buf_.size()) return Event::need_more;
    parser_ = std::make_unique<Parser>(limits_);
  }
  Parser& p = *parser_;
  // A request line longer than the target limit allows is 414 before Beast's header limit
  // (431) would see it: look for its end within the first limit + 64 bytes (method, version).
  if (!p.line_done) {
    const size_t window = limits_.max_target_bytes + 64;
    const size_t have = buf_.size() - start_;
    if (have > window && std::memchr(buf_.data() + start_, '\n', window) == nullptr) {
      fail(414, "request line longer than " + std::to_string(window) + " bytes (request target limit " +
                    std::to_string(limits_.max_target_bytes) + ", --http-max-target)");
      return Event::error;
    }
  }
  const std::string header_limit = "request header larger than " + std::to_string(limits_.max_header_bytes) +
                                   " bytes (--http-max-header-bytes)";
  error_code ec;
  while (start_ < buf_.size()) {
    const bool in_header = !p.is_header_done();
    p.chunk_header = false;
    const size_t used = p.put(boost::asio::const_buffer(buf_.data() + start_, buf_.size() - start_), ec);
    start_ += used;
    if (in_header) p.header_bytes += used;
    if (p.refusal_status != 0) {
      fail(p.refusal_status, p.refusal);
      return Event::error;
    }
    if (ec && ec != beast_http::error::need_more) {
      if (ec == beast_http::error::header_limit)
        fail(431, header_limit);
      else if (ec == beast_http::error::body_limit)
        fail(413, "request body larger than " + std::to_string(limits_.max_body_bytes) + " bytes (--max-body)");
      else
        fail(400, "malformed HTTP request: " + ec.message());
      return Event::error;
    }
    // Beast bounds the request line and the fields each by the header limit; the limit is
    // on both together.
    if (in_header && p.header_bytes > limits_.max_header_bytes) {
      fail(431, header_limit);
      return Event::error;
    }
    if (p.chunk_header && used > limits_.max_header_bytes) {
      fail(431, chunk_limit_message());
      return Event::error;
    }
    if (p.is_done()) {
      ready_ = std::make_unique<Request>(std::move(p.req));
      parser_.reset();
      return Event::request;
    }
    if (ec || used == 0) break;  // need more
  }
  // Waiting for more. What stays unparsed is part of the header, of a chunk-size line or of
  // the last chunk and trailer section: whatever arrives later, a part already over its
  // limit is refused now rather than buffered.
  const size_t pending = buf_.size() - start_;
  if (!p.is_header_done() && p.header_bytes + pending > limits_.max_header_bytes) {
    fail(431, header_limit);
    return Event::error;
  }
  if (p.is_header_done() && pending > limits_.max_header_bytes) {
    fail(431, chunk_limit_message());
    return Event::error;
  }
  if (p.is_header_done() && p.expect_continue && !p.continue_sent && p.req.version >= 11) {
    p.continue_sent = true;
    return Event::send_continue;
  }
  return Event::need_more;
}

}  // namespace afd::serve::http
