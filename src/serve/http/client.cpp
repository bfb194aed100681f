#include "serve/http/client.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace afd::serve::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

std::string ResponseHead::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

// Every socket operation runs on the thread inside run(), in `ioc`, one at a time (await);
// cancel() only sets `cancelled` and posts a close into `ioc`, which runs on that thread too.
struct ClientExchange::Impl {
  Impl(std::string h, int p, ClientTimeouts to) : host(std::move(h)), port(p), t(to) {}

  std::string host;
  int port;
  ClientTimeouts t;
  net::io_context ioc;
  tcp::socket sock{ioc};
  net::steady_timer timer{ioc};
  std::mutex mu;
  bool cancelled = false;  // guarded by mu

  bool is_cancelled() {
    std::lock_guard<std::mutex> l(mu);
    return cancelled;
  }
  void close() {
    error_code ignored;
    sock.close(ignored);
  }

  // Runs the one asynchronous operation start(done) begins until it calls done(ec), closing
  // the socket (so the operation ends with an error) if that takes longer than timeout_ms;
  // *timed_out says whether it did.
  template <typename Start>
  error_code await(int timeout_ms, bool* timed_out, Start start) {
    std::optional<error_code> result;
    *timed_out = false;
    start([this, &result](error_code ec) {
      result = ec;
      timer.cancel();
    });
    timer.expires_after(std::chrono::milliseconds(std::max(1, timeout_ms)));
    timer.async_wait([this, &result, timed_out](error_code ec) {
      if (ec || result) return;  // the operation finished first
      *timed_out = true;
      close();
    });
    ioc.restart();
    ioc.run();
    return *result;
  }
};

ClientExchange::ClientExchange(std::string host, int port, ClientTimeouts t)
    : impl_(std::make_unique<Impl>(std::move(host), port, t)) {}

ClientExchange::~ClientExchange() = default;

void ClientExchange::cancel() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    if (impl_->cancelled) return;
    impl_->cancelled = true;
  }
  net::post(impl_->ioc, [impl = impl_.get()] { impl->close(); });
}

ClientOutcome ClientExchange::run(const std::string& method, const std::string& target, const Headers& headers,
                                  const std::string& body, const std::function<bool(const ResponseHead&)>& on_head,
                                  const std::function<bool(const char*, size_t)>& on_data) {
  Impl& s = *impl_;
  ClientOutcome out;
  auto end = [&](ClientEnd e, std::string detail = {}) {
    s.close();
    out.end = e != ClientEnd::completed && s.is_cancelled() ? ClientEnd::cancelled : e;
    if (out.end != ClientEnd::cancelled) out.detail = std::move(detail);
    return out;
  };
  if (s.is_cancelled()) return end(ClientEnd::cancelled);

  error_code ec;
  tcp::resolver resolver(s.ioc);
  const auto endpoints = resolver.resolve(s.host, std::to_string(s.port), ec);
  if (ec) return end(ClientEnd::unreachable, ec.message());
  bool timed_out = false;
  ec = s.await(s.t.connect_ms, &timed_out, [&](auto done) {
    net::async_connect(s.sock, endpoints, [done](error_code e, const tcp::endpoint&) { done(e); });
  });
  if (timed_out) return end(ClientEnd::connect_timeout);
  if (ec) return end(ClientEnd::unreachable, ec.message());
  s.sock.set_option(tcp::no_delay(true), ec);

  bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
  req.set(bhttp::field::host, s.host + ":" + std::to_string(s.port));
  for (const auto& [k, v] : headers) req.insert(k, v);
  req.set(bhttp::field::connection, "close");
  req.body() = body;
  req.prepare_payload();
  bhttp::request_serializer<bhttp::string_body> sr{req};
  while (!sr.is_done()) {
    ec = s.await(s.t.write_ms, &timed_out, [&](auto done) {
      bhttp::async_write_some(s.sock, sr, [done](error_code e, size_t) { done(e); });
    });
    if (timed_out) return end(ClientEnd::write_failed, "timed out");
    if (ec) return end(ClientEnd::write_failed, ec.message());
  }

  bhttp::response_parser<bhttp::buffer_body> p;
  // A stream is as long as it is; callers bound what they keep. (Not boost::none: Boost 1.74's
  // parser compares a Content-Length against the empty limit and refuses every body.)
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::beast::flat_buffer in;
  std::array<char, 16384> piece;
  for (;;) {
    // Parse what has arrived: the head, then body pieces (chunked framing removed).
    while (!p.is_done()) {
      p.get().body().data = piece.data();
      p.get().body().size = piece.size();
      error_code pe;
      const size_t used = p.put(in.data(), pe);
      in.consume(used);
      if (pe == bhttp::error::need_buffer) pe = {};
      const size_t got = piece.size() - p.get().body().size;
      if (pe && pe != bhttp::error::need_more) return end(ClientEnd::malformed, pe.message());
      if (!out.responded && p.is_header_done()) {
        out.responded = true;
        ResponseHead h;
        h.status = static_cast<int>(p.get().result_int());
        for (const auto& f : p.get())
          h.headers.emplace_back(std::string(f.name_string().data(), f.name_string().size()),
                                 std::string(f.value().data(), f.value().size()));
        if (!on_head(h)) return end(ClientEnd::cancelled);
      }
      if (got > 0 && !on_data(piece.data(), got)) return end(ClientEnd::cancelled);
      if (pe == bhttp::error::need_more || (used == 0 && got == 0)) break;  // wants more bytes
    }
    if (p.is_done()) break;
    size_t n = 0;
    ec = s.await(s.t.read_ms, &timed_out, [&](auto done) {
      s.sock.async_read_some(in.prepare(piece.size()), [done, &n](error_code e, size_t k) {
        n = k;
        done(e);
      });
    });
    if (timed_out) return end(ClientEnd::read_timeout);
    in.commit(n);
    if (ec == net::error::eof) {
      error_code pe;
      p.put_eof(pe);  // ends a body delimited by the connection's end
      if (!pe && p.is_done()) break;
      return end(ClientEnd::closed);
    }
    if (ec) return end(ClientEnd::closed, ec.message());
  }
  return end(ClientEnd::completed);
}

}  // namespace afd::serve::http
