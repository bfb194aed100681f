// The HTTP layer (serve/http/server.h) over loopback with raw sockets: every limit answered
// with its 4xx and name, pipelining answered in order, deadlines against slow clients,
// 100-continue, HTTP/1.0, HEAD, connection and thread bounds, streaming.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "serve/http/server.h"

namespace afd::serve::http::test_http_limits {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Answer {
  int status = -1;  // -1: nothing (closed or timed out)
  Headers headers;
  std::string body;
  std::string header(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (iequals(k, name)) return v;
    return "";
  }
};

// A client that writes raw bytes and reads answers one by one (pipelined answers included).
class Raw {
 public:
  explicit Raw(int port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return connected_; }
  bool send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // One answer, within timeout_s.
  Answer read(double timeout_s = 30) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    Answer a;
    size_t head_end;
    while ((head_end = in_.find("\r\n\r\n")) == std::string::npos)
      if (!fill(deadline)) return a;
    const std::string head = in_.substr(0, head_end);
    in_.erase(0, head_end + 4);
    size_t eol = head.find("\r\n");
    const std::string line = head.substr(0, eol);
    a.status = std::atoi(line.substr(9, 3).c_str());
    while (eol != std::string::npos) {
      const size_t next = head.find("\r\n", eol + 2);
      const std::string f = head.substr(eol + 2, next == std::string::npos ? std::string::npos : next - eol - 2);
      const size_t colon = f.find(':');
      if (colon != std::string::npos) a.headers.emplace_back(f.substr(0, colon), f.substr(colon + 2));
      eol = next;
    }
    if (a.status == 100) return a;
    if (!a.header("Content-Length").empty()) {
      const size_t len = std::stoul(a.header("Content-Length"));
      while (in_.size() < len)
        if (!fill(deadline)) return Answer{};
      a.body = in_.substr(0, len);
      in_.erase(0, len);
    } else if (iequals(a.header("Transfer-Encoding"), "chunked")) {
      for (;;) {
        size_t e;
        while ((e = in_.find("\r\n")) == std::string::npos)
          if (!fill(deadline)) return Answer{};
        const size_t n = std::stoul(in_.substr(0, e), nullptr, 16);
        while (in_.size() < e + 2 + n + 2)
          if (!fill(deadline)) return Answer{};
        a.body += in_.substr(e + 2, n);
        in_.erase(0, e + 2 + n + 2);
        if (n == 0) break;
      }
    } else {
      while (fill(deadline)) {
      }
      a.body = in_;
      in_.clear();
    }
    return a;
  }
  // Whether the server closes the connection (end of stream or reset) within timeout_s.
  bool closed_within(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 100};
      if (::poll(&p, 1, 100) <= 0) continue;
      char b[4096];
      const ssize_t n = ::recv(fd_, b, sizeof b, 0);
      if (n <= 0) return true;
    }
    return false;
  }
  int fd() const { return fd_; }

 private:
  bool fill(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char b[65536];
    const ssize_t n = ::recv(fd_, b, sizeof b, 0);
    if (n <= 0) return false;
    in_.append(b, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string in_;
};

// A server with test routes on an ephemeral port, run on its own thread.
class LimitsTest : public ::testing::Test {
 protected:
  void start(Limits lim, int handler_threads = 4) {
    Options o;
    o.port = 0;
    o.limits = lim;
    o.handler_threads = handler_threads;
    o.name = "test server";
    srv_ = std::make_unique<Server>(o);
    srv_->get("/hello", [](const Request&, Response& res) { res.set_content("hello", "text/plain"); });
    // Echoes the body's size and first bytes, and the request's id header.
    srv_->post("/echo", [](const Request& req, Response& res) {
      res.set_header("X-Id", req.get_header_value("X-Id"));
      res.set_content(std::to_string(req.body.size()) + ":" + req.body.substr(0, 16), "text/plain");
    });
    srv_->get("/slow", [](const Request&, Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      res.set_content("slow", "text/plain");
    });
    srv_->get("/throw", [](const Request&, Response&) -> void { throw std::runtime_error("boom"); });
    srv_->get("/stream", [this](const Request&, Response& res) {
      res.set_chunked_content_provider(
          "text/event-stream",
          [](size_t, DataSink& sink) {
            for (int i = 0; i < 3; ++i) {
              const std::string ev = "data: " + std::to_string(i) + "\n\n";
              if (!sink.write(ev.data(), ev.size())) return false;
            }
            sink.done();
            return true;
          },
          [this](bool ok) { stream_ok_ = ok ? 1 : 0; });
    });
    // Writes until the client stops reading (then its write times out).
    srv_->get("/flood", [this](const Request&, Response& res) {
      res.set_chunked_content_provider(
          "application/octet-stream",
          [](size_t, DataSink& sink) {
            const std::string block(64 << 10, 'f');
            for (int i = 0; i < 100000; ++i)
              if (!sink.write(block.data(), block.size())) return false;
            sink.done();
            return true;
          },
          [this](bool ok) {
            flood_done_at_ = Clock::now();
            stream_ok_ = ok ? 1 : 0;
          });
    });
    auto port = srv_->bind();
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    port_ = *port;
    thread_ = std::thread([this] { srv_->run(); });
  }
  void TearDown() override {
    if (srv_) srv_->stop();
    if (thread_.joinable()) thread_.join();
  }
  static std::string post_echo(const std::string& body, const std::string& id = "") {
    return "POST /echo HTTP/1.1\r\nHost: t\r\nX-Id: " + id + "\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  }

  std::unique_ptr<Server> srv_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> stream_ok_{-1};
  Clock::time_point flood_done_at_{};
};

TEST_F(LimitsTest, ChunkedBodyOverTheLimitIs413AndCloses) {
  Limits lim;
  lim.max_body_bytes = 1024;
  start(lim);
  Raw c(port_);
  std::string req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 20; ++i) req += "64\r\n" + std::string(100, 'x') + "\r\n";  // 2000 bytes
  req += "0\r\n\r\n";
  ASSERT_TRUE(c.send(req));
  Answer a = c.read();
  EXPECT_EQ(a.status, 413);
  EXPECT_NE(a.body.find("--max-body"), std::string::npos) << a.body;
  EXPECT_EQ(a.header("Connection"), "close");
  EXPECT_TRUE(c.closed_within(30));
  // Within the limit, chunked reaches the handler decoded.
  Raw ok(port_);
  ASSERT_TRUE(ok.send("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  Answer b = ok.read();
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.body, "5:abcde");
}

TEST_F(LimitsTest, DeclaredLengthOverTheLimitIs413BeforeTheBody) {
  Limits lim;
  lim.max_body_bytes = 1024;
  start(lim);
  Raw c(port_);
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nContent-Length: 300000000\r\n\r\n"));
  Answer a = c.read();
  EXPECT_EQ(a.status, 413);
}

TEST_F(LimitsTest, PostWithoutLengthIs411Immediately) {
  Limits lim;
  lim.header_timeout_s = 120;
  lim.body_timeout_s = 120;
  start(lim);
  Raw c(port_);
  const auto t0 = Clock::now();
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\r\n"));
  Answer a = c.read(60);
  EXPECT_EQ(a.status, 411);
  EXPECT_LT(since(t0), 30.0);  // not after a deadline: at the end of the header
  EXPECT_NE(a.body.find("Content-Length"), std::string::npos) << a.body;
}

TEST_F(LimitsTest, TwoPipelinedRequestsInOneSegmentAreBothAnswered) {
  start(Limits{});
  Raw c(port_);
  ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n" + post_echo("second", "2")));
  Answer a = c.read(), b = c.read();
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "hello");
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.body, "6:second");
  EXPECT_EQ(b.header("X-Id"), "2");
}

TEST_F(LimitsTest, ManyPipelinedRequestsAreAnsweredInOrder) {
  start(Limits{}, /*handler_threads=*/2);
  Raw c(port_);
  std::string all;
  const int n = 200;
  for (int i = 0; i < n; ++i) {
    if (i % 3 == 0) all += "GET /hello HTTP/1.1\r\n\r\n";
    else if (i % 3 == 1) all += post_echo("body" + std::to_string(i), std::to_string(i));
    else all += "POST /echo HTTP/1.1\r\nX-Id: " + std::to_string(i) + "\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nc\r\n0\r\n\r\n";
  }
  ASSERT_TRUE(c.send(all));
  for (int i = 0; i < n; ++i) {
    Answer a = c.read();
    ASSERT_EQ(a.status, 200) << "answer " << i;
    if (i % 3 == 0) {
      EXPECT_EQ(a.body, "hello") << i;
    }
    if (i % 3 == 1) {
      EXPECT_EQ(a.body, std::to_string(4 + std::to_string(i).size()) + ":body" + std::to_string(i)) << i;
    }
    if (i % 3 != 0) {
      EXPECT_EQ(a.header("X-Id"), std::to_string(i)) << i;
    }
    if (i % 3 == 2) {
      EXPECT_EQ(a.body, "1:c") << i;
    }
  }
}

TEST_F(LimitsTest, SlowlorisHeaderGets408WithinTheDeadline) {
  Limits lim;
  lim.header_timeout_s = 1;
  start(lim);
  Raw c(port_);
  const auto t0 = Clock::now();
  ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\nHost: t\r\n"));
  // One more header byte every 200 ms: progress does not extend the deadline.
  auto trickle = std::async(std::launch::async, [&c] {
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (!c.send("X")) return;
    }
  });
  Answer a = c.read(30);
  const double waited = since(t0);
  EXPECT_EQ(a.status, 408);
  EXPECT_NE(a.body.find("--http-header-timeout-s"), std::string::npos) << a.body;
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 20.0);
  EXPECT_TRUE(c.closed_within(30));
  trickle.wait();
  EXPECT_GE(srv_->counters().timeouts, 1u);
}

TEST_F(LimitsTest, SlowBodyGets408) {
  Limits lim;
  lim.body_timeout_s = 1;
  start(lim);
  Raw c(port_);
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly a part"));
  Answer a = c.read(30);
  EXPECT_EQ(a.status, 408);
  EXPECT_NE(a.body.find("--http-body-timeout-s"), std::string::npos) << a.body;
}

TEST_F(LimitsTest, SilentConnectionsAreClosed) {
  Limits lim;
  lim.header_timeout_s = 1;
  lim.idle_timeout_s = 1;
  start(lim);
  Raw silent(port_);  // connects, never sends
  EXPECT_TRUE(silent.closed_within(30));
  Raw idle(port_);  // one request, then keeps the connection open
  ASSERT_TRUE(idle.send("GET /hello HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(idle.read().status, 200);
  const auto t0 = Clock::now();
  EXPECT_TRUE(idle.closed_within(30));
  EXPECT_GE(since(t0), 0.5);
}

TEST_F(LimitsTest, OversizedHeadersAre431AndLongTargets414) {
  Limits lim;
  lim.max_header_bytes = 4096;
  lim.max_headers = 20;
  lim.max_target_bytes = 1024;
  start(lim);
  {
    Raw c(port_);
    ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\nCookie: " + std::string(8000, 'c') + "\r\n\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 431);
    EXPECT_NE(a.body.find("--http-max-header-bytes"), std::string::npos) << a.body;
  }
  {
    Raw c(port_);
    std::string req = "GET /hello HTTP/1.1\r\n";
    for (int i = 0; i < 30; ++i) req += "X-H" + std::to_string(i) + ": 1\r\n";
    ASSERT_TRUE(c.send(req + "\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 431);
    EXPECT_NE(a.body.find("--http-max-headers"), std::string::npos) << a.body;
  }
  {
    Raw c(port_);
    ASSERT_TRUE(c.send("GET /" + std::string(3000, 'p') + " HTTP/1.1\r\n\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 414);
    EXPECT_NE(a.body.find("--http-max-target"), std::string::npos) << a.body;
  }
}

TEST_F(LimitsTest, ExpectContinueGetsA100ThenTheAnswer) {
  start(Limits{});
  Raw c(port_);
  const std::string body(5000, 'b');
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"));
  Answer cont = c.read();
  ASSERT_EQ(cont.status, 100);
  ASSERT_TRUE(c.send(body));
  Answer a = c.read();
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "5000:bbbbbbbbbbbbbbbb");
  // The connection goes on.
  ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(c.read().body, "hello");
}

TEST_F(LimitsTest, Http10AndConnectionCloseEndTheConnection) {
  start(Limits{});
  {
    Raw c(port_);
    ASSERT_TRUE(c.send("GET /hello HTTP/1.0\r\n\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.body, "hello");
    EXPECT_TRUE(c.closed_within(30));
  }
  {
    Raw c(port_);  // HTTP/1.0 streaming: no chunked framing, the end of the body is the close
    ASSERT_TRUE(c.send("GET /stream HTTP/1.0\r\n\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  }
  {
    Raw c(port_);  // a request pipelined after Connection: close is not answered
    ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\nConnection: close\r\n\r\nGET /hello HTTP/1.1\r\n\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.header("Connection"), "close");
    EXPECT_TRUE(c.closed_within(30));
  }
}

TEST_F(LimitsTest, HeadAnswersTheGetHeaderWithoutBody) {
  start(Limits{});
  Raw c(port_);
  ASSERT_TRUE(c.send("HEAD /hello HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n"));
  // The HEAD answer has Content-Length 5 and no body: the next bytes are the GET's answer.
  const auto t0 = Clock::now();
  std::string all;
  char b[4096];
  while (all.find("\r\n\r\nhello") == std::string::npos && since(t0) < 30) {
    pollfd p{c.fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(c.fd(), b, sizeof b, 0);
    if (n <= 0) break;
    all.append(b, static_cast<size_t>(n));
  }
  const size_t second = all.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << all;
  const std::string head = all.substr(0, second);
  EXPECT_NE(head.find("Content-Length: 5"), std::string::npos) << head;
  EXPECT_EQ(head.find("hello"), std::string::npos) << head;
  EXPECT_NE(all.find("hello", second), std::string::npos);
}

TEST_F(LimitsTest, UnknownRoutes404WrongMethod405AndExceptions500) {
  start(Limits{});
  Raw c(port_);
  ASSERT_TRUE(c.send("GET /nope HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\nGET /throw HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(c.read().status, 404);
  Answer m = c.read();
  EXPECT_EQ(m.status, 405);
  EXPECT_EQ(m.header("Allow"), "POST");
  Answer t = c.read();
  EXPECT_EQ(t.status, 500);
  EXPECT_NE(t.body.find("boom"), std::string::npos) << t.body;
  EXPECT_EQ(c.read().body, "hello");  // the server and the connection carry on
}

TEST_F(LimitsTest, ConnectionsOverTheLimitAreRefused) {
  Limits lim;
  lim.max_connections = 4;
  start(lim);
  std::vector<std::unique_ptr<Raw>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Raw>(port_));
    ASSERT_TRUE(held.back()->send("GET /hello HTTP/1.1\r\n\r\n"));
    ASSERT_EQ(held.back()->read().status, 200);
  }
  Raw over(port_);
  EXPECT_TRUE(over.closed_within(30));  // after a best-effort 503
  EXPECT_EQ(srv_->counters().refused, 1u);
  held.clear();
  // Slots come back as connections close.
  Answer a;
  for (int i = 0; i < 300 && a.status != 200; ++i) {
    Raw again(port_);
    again.send("GET /hello HTTP/1.1\r\n\r\n");
    a = again.read(5);
    if (a.status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(a.status, 200);
}

// Slow clients hold no thread: with 2 handler threads and 2 I/O threads, 300 connections
// trickling headers do not stop well-formed requests from being answered at once.
TEST_F(LimitsTest, SlowClientsDoNotStarveOthers) {
  Limits lim;
  lim.header_timeout_s = 60;
  start(lim, /*handler_threads=*/2);
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 300; ++i) {
    slow.push_back(std::make_unique<Raw>(port_));
    ASSERT_TRUE(slow.back()->send("GET /hello HTTP/1.1\r\nX-Slow: "));
  }
  for (int i = 0; i < 20; ++i) {
    Raw c(port_);
    ASSERT_TRUE(c.send(post_echo("fast")));
    Answer a = c.read(30);
    ASSERT_EQ(a.status, 200) << i;
    EXPECT_EQ(a.body, "4:fast");
  }
  EXPECT_GE(srv_->counters().open_connections, 300);
}

TEST_F(LimitsTest, StreamsAreChunkedAndAStalledReaderTimesOut) {
  Limits lim;
  lim.write_timeout_s = 1;
  start(lim);
  {
    Raw c(port_);
    ASSERT_TRUE(c.send("GET /stream HTTP/1.1\r\n\r\n"));
    Answer a = c.read();
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.header("Transfer-Encoding"), "chunked");
    EXPECT_EQ(a.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    for (int i = 0; i < 200 && stream_ok_.load() < 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(stream_ok_.load(), 1);
  }
  stream_ok_ = -1;
  Raw stalled(port_, /*rcvbuf=*/4096);
  ASSERT_TRUE(stalled.send("GET /flood HTTP/1.1\r\n\r\n"));
  // Never reads: the server's writes stop making progress and fail after the write timeout.
  for (int i = 0; i < 3000 && stream_ok_.load() < 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(stream_ok_.load(), 0);
}

TEST_F(LimitsTest, StopWaitsForHandlersAndEndsRun) {
  start(Limits{});
  Raw c(port_);
  ASSERT_TRUE(c.send("GET /slow HTTP/1.1\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the handler is running
  srv_->stop();
  thread_.join();  // run() returned once the handler finished
  Answer a = c.read(10);
  EXPECT_TRUE(a.status == 200 || a.status == -1);  // answered, or closed: never a hang
  // A server stopped before run() returns from run() at once.
  Options o;
  o.port = 0;
  Server s(o);
  ASSERT_TRUE(s.bind().ok());
  s.stop();
  EXPECT_TRUE(s.run());
}

}  // namespace
}  // namespace afd::serve::http::test_http_limits
