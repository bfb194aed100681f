// The front end and its HTTP client facing broken attention workers: fake workers over raw
// loopback sockets that reset the connection, never answer, answer 503 without a reason,
// or are not listening. Every failure is named (reset, refused and timeout told apart), and
// every 503 of the front end gives each worker's reason; a lost worker process makes
// /health 503 naming it.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../unit/serve/http_test_client.h"
#include "frontend_test_model.h"
#include "serve/frontend/frontend.h"
#include "serve/frontend/proxy_client.h"

namespace afd::serve {
namespace {

using json = nlohmann::json;

// A socket bound to a free 127.0.0.1 port; listening or not.
int bound_socket(int* port, bool listening) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || (listening && listen(fd, 16) != 0)) {
    ADD_FAILURE() << "cannot bind a loopback socket";
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

void respond(int fd, int status, const std::string& body) {
  send_all(fd, "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
}

// Closes with a TCP reset (SO_LINGER 0), as a crashed process with unread input does.
void reset(int fd) {
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
}

// An HTTP/1.1 peer on raw sockets: handle(fd, "GET /health") per request, then closes the
// connection (handle may reset() it first, or wait on stopping() to hold it unanswered).
class FakeWorker {
 public:
  using Handler = std::function<void(int fd, const std::string& request_line, FakeWorker& self)>;
  explicit FakeWorker(Handler h) : handle_(std::move(h)) {
    fd_ = bound_socket(&port_, /*listening=*/true);
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeWorker() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (auto& t : conns_) t.join();
    if (fd_ >= 0) close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  bool stopping() const { return stop_.load(); }

 private:
  void loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      conns_.emplace_back([this, c] {
        std::string req;
        char buf[4096];
        // The head, then any body its Content-Length announces (read and dropped).
        while (req.find("\r\n\r\n") == std::string::npos) {
          pollfd q{c, POLLIN, 0};
          if (stop_ || poll(&q, 1, 20) < 0) break;
          if (!(q.revents & POLLIN)) continue;
          const ssize_t n = recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          req.append(buf, static_cast<size_t>(n));
        }
        const size_t head_end = req.find("\r\n\r\n");
        if (head_end != std::string::npos) {
          size_t want = 0;
          const size_t at = req.find("Content-Length: ");
          if (at != std::string::npos && at < head_end) want = std::stoul(req.substr(at + 16));
          while (req.size() - head_end - 4 < want) {
            const ssize_t n = recv(c, buf, sizeof buf, 0);
            if (n <= 0) break;
            req.append(buf, static_cast<size_t>(n));
          }
          const std::string line = req.substr(0, req.find(" HTTP/"));
          handle_(c, line, *this);
        }
        close(c);
      });
    }
  }
  Handler handle_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::thread> conns_;  // joined by the destructor
};

void hold_unanswered(FakeWorker& self) {
  while (!self.stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// What an attention worker of that model answers on /health.
std::string healthy_body(const std::string& dir) {
  return json{{"status", "ok"}, {"role", "attention"}, {"model", "m"}, {"model_config", frontend_model_fingerprint(dir)}}
      .dump();
}

TEST(ProxyClientErrors, TellRefusedResetAndTimeoutApart) {
  int refused_port = 0;
  const int refused_fd = bound_socket(&refused_port, /*listening=*/false);  // bound, not listening: refused
  ASSERT_GE(refused_fd, 0);
  auto r = http_get("127.0.0.1", refused_port, "/health", 2000, 1 << 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("connection refused"), std::string::npos) << r.status().to_string();
  close(refused_fd);

  FakeWorker resets([](int fd, const std::string&, FakeWorker&) { reset(fd); });
  r = http_get("127.0.0.1", resets.port(), "/health", 5000, 1 << 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("connection closed or reset by the peer"), std::string::npos)
      << r.status().to_string();

  FakeWorker silent([](int, const std::string&, FakeWorker& self) { hold_unanswered(self); });
  r = http_get("127.0.0.1", silent.port(), "/health", 300, 1 << 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no answer within 300 ms (read timed out)"), std::string::npos)
      << r.status().to_string();

  // The proxy's own exchange: reset before any answer, and mid-response.
  auto no_head = [](const UpstreamHead&) { return true; };
  auto no_data = [](const char*, size_t) { return true; };
  UpstreamCall reset_call("127.0.0.1", resets.port(), UpstreamTimeouts{});
  UpstreamOutcome out = reset_call.post("/v1/completions", "{}", no_head, no_data);
  EXPECT_FALSE(out.responded);
  EXPECT_NE(out.error.message().find("connection closed or reset by the peer"), std::string::npos)
      << out.error.to_string();
  FakeWorker cut([](int fd, const std::string&, FakeWorker&) {
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000\r\n\r\ndata: {}\n\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    reset(fd);
  });
  UpstreamCall cut_call("127.0.0.1", cut.port(), UpstreamTimeouts{});
  out = cut_call.post("/v1/completions", "{}", no_head, no_data);
  EXPECT_TRUE(out.responded);
  EXPECT_NE(out.error.message().find("connection closed or reset by the peer (mid-response)"), std::string::npos)
      << out.error.to_string();
  UpstreamTimeouts quick;
  quick.read_s = 1;
  UpstreamCall slow_call("127.0.0.1", silent.port(), quick);
  out = slow_call.post("/v1/completions", "{}", no_head, no_data);
  EXPECT_NE(out.error.message().find("no answer within 1000 ms (read timed out)"), std::string::npos)
      << out.error.to_string();
}

struct RunningFrontend {
  std::unique_ptr<Frontend> f;
  std::future<Status> run;
  ~RunningFrontend() {
    if (!f) return;
    f->stop();
    if (run.valid()) {
      EXPECT_TRUE(run.get().is_ok());
    }
  }
};

void start_frontend(FrontendOptions fo, RunningFrontend* rf) {
  fo.server.port = 0;
  fo.server.http_threads = 4;
  fo.health_interval_ms = 50;
  fo.federate = false;
  auto f = Frontend::create(std::move(fo));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE((*f)->start().is_ok());
  rf->f = std::move(*f);
  Frontend* raw = rf->f.get();
  rf->run = std::async(std::launch::async, [raw] { return raw->run(); });
}

// Every worker a 503 lists has a reason, and says which kind of failure it was: the one
// that reset the request's connection (up by its /health: the reason the request found,
// not its health check's ""), one answering 503 without a message, one that never answers
// its health check, one not listening.
TEST(FrontendReasons, Every503NamesEachWorkersReason) {
  const std::string dir = frontend_model_dir("reasons");
  ASSERT_FALSE(dir.empty());
  const std::string ok_body = healthy_body(dir);
  FakeWorker resets_requests([ok_body](int fd, const std::string& line, FakeWorker&) {
    if (line == "GET /health") return respond(fd, 200, ok_body);
    reset(fd);
  });
  FakeWorker empty_503([](int fd, const std::string&, FakeWorker&) {
    respond(fd, 503, R"({"error":{"message":"","type":"service_unavailable"}})");
  });
  FakeWorker silent([](int, const std::string&, FakeWorker& self) { hold_unanswered(self); });
  int refused_port = 0;
  const int refused_fd = bound_socket(&refused_port, /*listening=*/false);
  ASSERT_GE(refused_fd, 0);

  FrontendOptions fo;
  fo.model_dir = dir;
  fo.health_timeout_ms = 300;
  fo.workers = {resets_requests.address(), empty_503.address(), silent.address(),
                "127.0.0.1:" + std::to_string(refused_port)};
  RunningFrontend rf;
  start_frontend(fo, &rf);
  ASSERT_TRUE(rf.f);
  Frontend* f = rf.f.get();
  std::string why;
  for (int i = 0; i < 1000; ++i) {  // every worker checked once (the silent one takes 300 ms)
    why = f->why_workers_down();
    if (f->workers_up() == 1 && why.find("read timed out") != std::string::npos &&
        why.find("connection refused") != std::string::npos && why.find("without a reason") != std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(f->workers_up(), 1) << why;

  testing::TestClient cli("127.0.0.1", f->port());
  auto res = cli.post("/v1/completions", R"({"prompt":"hello","max_tokens":2})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_FALSE(res->get_header_value("Retry-After").empty());
  const std::string msg = json::parse(res->body)["error"]["message"].get<std::string>();
  EXPECT_NE(msg.find("worker 0: a request found it unreachable: attention worker " + resets_requests.address() +
                     ": connection closed or reset by the peer"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("worker 1: answered 503 without a reason"), std::string::npos) << msg;
  EXPECT_NE(msg.find("worker 2: " + silent.address() + "/health: no answer within 300 ms (read timed out)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("worker 3: 127.0.0.1:" + std::to_string(refused_port) +
                     "/health: connection refused (nothing listening) or host unreachable"),
            std::string::npos)
      << msg;
  for (const char* empty : {": ;", ": )", ":  "}) EXPECT_EQ(msg.find(empty), std::string::npos) << msg;
  close(refused_fd);
  std::filesystem::remove_all(dir);
}

// A worker process the launcher will not start again makes /health 503 naming it (even with
// every attention worker up), and leads the reasons of every 503.
TEST(FrontendReasons, LostWorkerProcessMakesHealth503) {
  const std::string dir = frontend_model_dir("lost");
  ASSERT_FALSE(dir.empty());
  const std::string ok_body = healthy_body(dir);
  FakeWorker healthy([ok_body](int fd, const std::string&, FakeWorker&) { respond(fd, 200, ok_body); });
  std::atomic<bool> lost{false};
  const std::string why = "FFN worker 0/1 (process 42) exited (signal 9) and is not restarted: restarts exhausted";
  FrontendOptions fo;
  fo.model_dir = dir;
  fo.workers = {healthy.address()};
  fo.lost_workers = [&lost, why] { return lost ? why : std::string(); };
  RunningFrontend rf;
  start_frontend(fo, &rf);
  ASSERT_TRUE(rf.f);
  testing::TestClient cli("127.0.0.1", rf.f->port());
  int status = 0;
  for (int i = 0; i < 500 && status != 200; ++i) {
    if (auto r = cli.get("/health")) status = r->status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(status, 200);
  lost = true;
  auto r = cli.get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("worker process lost for good"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find(why), std::string::npos) << r->body;
  EXPECT_EQ(rf.f->why_workers_down(), "lost for good: " + why);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace afd::serve
