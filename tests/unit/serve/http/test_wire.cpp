// What the HTTP layer writes: response heads, its own error bodies, send_all's timeout.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/http/wire.h"

namespace afd::serve::http::test_wire {
namespace {

TEST(Wire, ResponseHeadOwnsFramingFieldsAndDropsLineBreaks) {
  // A header value from elsewhere (an upstream's Retry-After) cannot add lines; the fields
  // that frame the body are the server's own.
  const Headers extra = {{"Retry-After", "1\r\nSet-Cookie: x=y"}, {"Content-Length", "999"},
                         {"Transfer-Encoding", "gzip"}, {"Connection", "keep-alive"}, {"X-A", "b"}};
  const std::string h = response_head(503, extra, "application/json", size_t{12}, false, true);
  EXPECT_EQ(h.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << h;
  EXPECT_NE(h.find("Retry-After: 1Set-Cookie: x=y\r\n"), std::string::npos) << h;
  EXPECT_EQ(h.find("\r\nSet-Cookie"), std::string::npos) << h;
  EXPECT_NE(h.find("Content-Length: 12\r\n"), std::string::npos) << h;
  EXPECT_EQ(h.find("999"), std::string::npos) << h;
  EXPECT_EQ(h.find("gzip"), std::string::npos) << h;
  EXPECT_EQ(h.find("keep-alive"), std::string::npos) << h;
  EXPECT_NE(h.find("Connection: close\r\n"), std::string::npos) << h;
  EXPECT_NE(h.find("X-A: b\r\n"), std::string::npos) << h;
  EXPECT_EQ(h.substr(h.size() - 4), "\r\n\r\n");
  const std::string chunked = response_head(200, {}, "text/event-stream", std::nullopt, true, false);
  EXPECT_NE(chunked.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << chunked;
  EXPECT_EQ(chunked.find("Content-Length"), std::string::npos) << chunked;
  EXPECT_EQ(chunked.find("Connection"), std::string::npos) << chunked;
}

TEST(Wire, DefaultErrorBodyIsValidJsonWhateverTheMessage) {
  const std::string msg = std::string("no route for GET /a\"b\\c\n\x01\x7f") + "\xc3\xa9";
  auto j = nlohmann::json::parse(default_error_body(404, msg));
  EXPECT_EQ(j["error"]["message"], msg);
  EXPECT_EQ(j["error"]["code"], 404);
}

TEST(Wire, SendAllFailsWhenTheReaderStalls) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  EXPECT_TRUE(send_all(sv[0], std::string("hello"), 5.0));
  char b[8];
  EXPECT_EQ(read(sv[1], b, sizeof b), 5);
  // Nobody reads: the writes stop making progress and fail after the timeout.
  const std::string big(8 << 20, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(send_all(sv[0], big, 0.3));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.25);
  EXPECT_LT(s, 30.0);
  close(sv[0]);
  close(sv[1]);
}

}  // namespace
}  // namespace afd::serve::http::test_wire
