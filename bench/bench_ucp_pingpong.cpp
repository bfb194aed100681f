// bench_ucp_pingpong: the bare UCP tag ping-pong that afd's UcxTransport is built on, with
// no afd code in the loop — to tell what the posting order costs from what afd's own
// bookkeeping costs (bench_comm compares afd with ucx_perftest, which posts send first).
//
//   bench_ucp_pingpong [--sizes 64,4096] [--iters 20000] [--warmup 1000] [--repeat 3]
//                      [--order recv-first|send-first|both] [--memh]
//
// Two processes (fork; worker addresses exchanged over a socketpair), one ucp worker each
// (UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP, single-threaded, as afd's), shared-memory transports
// as UCX picks them. The client posts its receive first (as afd's runtime does) or its send
// first (as ucx_perftest does), then drives ucp_worker_progress until a completion callback
// sets a flag; the server receives then replies from a buffer nothing writes. Receives use
// UCP_OP_ATTR_FLAG_NO_IMM_CMPL as afd's do. --memh registers the buffers and passes their
// handles. Reports half the round trip, median of --iters, best of --repeat; the clock is the
// TSC on x86 (as ucx_perftest and bench_comm read it), clock_gettime elsewhere.
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/socket_util.h"
#include "core/timer.h"
#include "ucp_worker_util.h"

using afd::now_ns;

namespace {

uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(now_ns());
#endif
}

using namespace afd::bench;  // Flag, send_done, recv_done, make_ucp_worker

struct Side {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  ucp_mem_h in_memh = nullptr, out_memh = nullptr;
};

// The socketpair handshake (addresses, "ready") gets 10 s.
int64_t handshake_deadline() { return now_ns() + int64_t{10} * 1000000000; }

bool write_all(int fd, const void* p, size_t n) { return afd::comm::send_all(fd, p, n, handshake_deadline()).is_ok(); }
bool read_all(int fd, void* p, size_t n) { return afd::comm::recv_all(fd, p, n, handshake_deadline()).is_ok(); }

// Context, worker, and an endpoint to the process at the other end of `fd`.
bool connect_side(int fd, Side* s) {
  if (!make_ucp_worker(&s->ctx, &s->worker)) return false;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (ucp_worker_get_address(s->worker, &addr, &len) != UCS_OK) return false;
  bool sent = write_all(fd, &len, sizeof len) && write_all(fd, addr, len);
  ucp_worker_release_address(s->worker, addr);
  size_t peer_len = 0;
  if (!sent || !read_all(fd, &peer_len, sizeof peer_len) || peer_len > (1u << 20)) return false;
  std::vector<char> peer(peer_len);
  if (!read_all(fd, peer.data(), peer_len)) return false;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer.data());
  return ucp_ep_create(s->worker, &ep, &s->ep) == UCS_OK;
}

ucp_mem_h map(Side& s, void* p, size_t n) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = p;
  mp.length = n;
  ucp_mem_h h = nullptr;
  return ucp_mem_map(s.ctx, &mp, &h) == UCS_OK ? h : nullptr;
}

// Request parameters with a completion flag, `extra` attribute flags, and `memh` if any.
ucp_request_param_t params(Flag* f, ucp_mem_h memh, uint32_t extra) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | extra;
  p.user_data = f;
  if (memh != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  f->done = false;
  return p;
}

void* post_recv(Side& s, void* buf, size_t n, uint64_t tag, Flag* f) {
  ucp_request_param_t p = params(f, s.in_memh, UCP_OP_ATTR_FLAG_NO_IMM_CMPL);
  p.cb.recv = recv_done;
  return ucp_tag_recv_nbx(s.worker, buf, n, tag, ~uint64_t{0}, &p);
}

void* post_send(Side& s, const void* buf, size_t n, uint64_t tag, Flag* f) {
  ucp_request_param_t p = params(f, s.out_memh, 0);
  p.cb.send = send_done;
  void* r = ucp_tag_send_nbx(s.ep, buf, n, tag, &p);
  if (r == nullptr) f->done = true;  // completed inside the call (no callback then)
  return r;
}

// Progresses until the operation's flag is set; false on a UCX error.
bool finish(Side& s, void* req, Flag* f) {
  if (req == nullptr) return true;
  if (UCS_PTR_IS_ERR(req)) return false;
  while (!f->done) ucp_worker_progress(s.worker);
  ucp_request_free(req);
  return true;
}

// One measurement: returns the median half round trip in us, or a negative value on failure.
double run_once(size_t size, int iters, int warmup, bool recv_first, bool memh) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  bool server = pid == 0;
  int fd = server ? sv[1] : sv[0];
  ::close(server ? sv[0] : sv[1]);
  Side s;
  std::vector<char> in(size), out(size, 0x5a);
  bool ok = connect_side(fd, &s);
  if (ok && memh) {
    s.in_memh = map(s, in.data(), size);
    s.out_memh = map(s, out.data(), size);
    ok = s.in_memh != nullptr && s.out_memh != nullptr;
  }
  char go = ok ? 1 : 0, peer_go = 0;
  if (!write_all(fd, &go, 1) || !read_all(fd, &peer_go, 1) || go == 0 || peer_go == 0) ok = false;
  Flag fr, fs;
  if (server) {
    for (int i = 0; ok && i < warmup + iters; ++i) {
      ok = finish(s, post_recv(s, in.data(), size, 1, &fr), &fr) && finish(s, post_send(s, out.data(), size, 2, &fs), &fs);
    }
    // Let the client's last receive complete before the worker goes away.
    int64_t until = now_ns() + 100000000;
    while (now_ns() < until) ucp_worker_progress(s.worker);
    _exit(ok ? 0 : 1);
  }
  std::vector<uint64_t> rounds;
  rounds.reserve(static_cast<size_t>(iters));
  int64_t ns0 = now_ns();
  uint64_t tick0 = ticks(), t0 = tick0;
  for (int i = 0; ok && i < warmup + iters; ++i) {
    void *r, *w;
    if (recv_first) {
      r = post_recv(s, in.data(), size, 2, &fr);
      w = post_send(s, out.data(), size, 1, &fs);
    } else {
      w = post_send(s, out.data(), size, 1, &fs);
      r = post_recv(s, in.data(), size, 2, &fr);
    }
    ok = finish(s, r, &fr) && finish(s, w, &fs);
    uint64_t t1 = ticks();
    if (i >= warmup) rounds.push_back(t1 - t0);
    t0 = t1;
  }
  double ns_per_tick = static_cast<double>(now_ns() - ns0) / static_cast<double>(ticks() - tick0);
  int child = 0;
  waitpid(pid, &child, 0);
  if (!ok || rounds.empty() || child != 0) return -1;
  std::sort(rounds.begin(), rounds.end());
  return static_cast<double>(rounds[rounds.size() / 2]) * ns_per_tick * 1e-3 / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {64, 4096};
  int iters = 20000, warmup = 1000, repeat = 3;
  std::string order = "both";
  bool memh = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string tok;
      while (std::getline(ss, tok, ',')) sizes.push_back(std::stoull(tok));
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--warmup" && i + 1 < argc) {
      warmup = std::max(0, std::stoi(argv[++i]));
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--order" && i + 1 < argc) {
      order = argv[++i];
    } else if (a == "--memh") {
      memh = true;
    } else {
      std::fprintf(stderr, "usage: bench_ucp_pingpong [--sizes a,b] [--iters N] [--warmup N] [--repeat R] "
                           "[--order recv-first|send-first|both] [--memh]\n");
      return 1;
    }
  }
  if (order != "both" && order != "recv-first" && order != "send-first") {
    std::fprintf(stderr, "--order: recv-first, send-first or both\n");
    return 1;
  }
  std::printf("bare ucp tag ping-pong, half round trip, median of %d, best of %d%s\n", iters, repeat,
              memh ? ", registered buffers" : "");
  std::printf("%10s | %12s | %12s\n", "bytes", "recv first", "send first");
  for (size_t size : sizes) {
    double best[2] = {-1, -1};
    for (int rep = 0; rep < repeat; ++rep) {
      for (int o = 0; o < 2; ++o) {
        if ((o == 0 && order == "send-first") || (o == 1 && order == "recv-first")) continue;
        double v = run_once(size, iters, warmup, o == 0, memh);
        if (v > 0 && (best[o] < 0 || v < best[o])) best[o] = v;
      }
    }
    auto cell = [](double v) { return v > 0 ? std::to_string(v).substr(0, 5) + " us" : std::string("-"); };
    std::printf("%10zu | %12s | %12s\n", size, cell(best[0]).c_str(), cell(best[1]).c_str());
  }
  return 0;
}
