// bench_comm_overhead: afd's own cost per message over bare UCP, on one thread, without the
// cross-core transfer that a ping-pong between processes adds (and whose cost depends on
// where the two processes' cores sit).
//
//   bench_comm_overhead [--iters 200000] [--repeat 5] [--size 64] [--only afd|ucp]
//
// Both loops run one message at a time through UCX shared memory between two workers of
// this process, on this thread:
//   ucp  two ucp workers: ucp_tag_recv_nbx (NO_IMM_CMPL, callback flag) on one,
//        ucp_tag_send_nbx on the other, ucp_worker_progress on the first until the flag
//   afd  two UcxTransports (as afd's workers use them): post_recv, post_send, wait(recv),
//        wait(send)
// and report ns per message (the mean over --iters, best of --repeat, alternating). The
// difference is what afd's transport adds to a message's critical path on each side.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/frame_buffer.h"
#include "comm/ucx_transport.h"
#include "core/timer.h"
#include "ucp_worker_util.h"

using namespace afd;
using namespace afd::comm;

namespace {

using namespace afd::bench;  // Flag, send_done, recv_done, make_ucp_worker

struct Worker {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ~Worker() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (ctx != nullptr) ucp_cleanup(ctx);
  }
};

bool make_worker(Worker* w) { return make_ucp_worker(&w->ctx, &w->worker); }

// ns per message, or a negative value on failure.
double run_ucp(size_t size, int iters) {
  Worker a, b;
  if (!make_worker(&a) || !make_worker(&b)) return -1;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (ucp_worker_get_address(a.worker, &addr, &len) != UCS_OK) return -1;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = addr;
  ucp_ep_h to_a = nullptr;
  ucs_status_t st = ucp_ep_create(b.worker, &ep, &to_a);
  ucp_worker_release_address(a.worker, addr);
  if (st != UCS_OK) return -1;
  std::vector<char> in(size), out(size, 0x5a);
  Flag fr, fs;
  auto one = [&]() {
    ucp_request_param_t pr{};
    pr.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    pr.cb.recv = recv_done;
    pr.user_data = &fr;
    fr.done = false;
    void* r = ucp_tag_recv_nbx(a.worker, in.data(), size, 1, ~uint64_t{0}, &pr);
    ucp_request_param_t ps{};
    ps.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    ps.cb.send = send_done;
    ps.user_data = &fs;
    fs.done = false;
    void* s = ucp_tag_send_nbx(to_a, out.data(), size, 1, &ps);
    if (UCS_PTR_IS_ERR(r) || UCS_PTR_IS_ERR(s)) return false;
    while (!fr.done) {
      ucp_worker_progress(a.worker);
      ucp_worker_progress(b.worker);  // a send that did not finish at post
    }
    ucp_request_free(r);
    if (s != nullptr) {
      while (!fs.done) ucp_worker_progress(b.worker);
      ucp_request_free(s);
    }
    return true;
  };
  for (int i = 0; i < 1000; ++i) {
    if (!one()) return -1;
  }
  int64_t t0 = now_ns();
  for (int i = 0; i < iters; ++i) {
    if (!one()) return -1;
  }
  double ns = static_cast<double>(now_ns() - t0) / iters;
  ucp_request_param_t pc{};
  void* c = ucp_ep_close_nbx(to_a, &pc);
  if (UCS_PTR_IS_PTR(c)) {
    while (ucp_request_check_status(c) == UCS_INPROGRESS) {
      ucp_worker_progress(a.worker);
      ucp_worker_progress(b.worker);
    }
    ucp_request_free(c);
  }
  return ns;
}

double run_afd(size_t size, int iters) {
  // The progress threads sleep once idle instead of polling on: b's sender never waits
  // (its small sends finish at post), so its progress thread would otherwise poll beside
  // this thread and hold b's worker, pushing posts onto the command queue (in a ping-pong
  // both sides wait, which parks them).
  UcxOptions oa{"overhead-a"}, ob{"overhead-b"};
  oa.progress_spin_ns = ob.progress_spin_ns = 0;
  auto a = UcxTransport::create(oa);
  auto b = UcxTransport::create(ob);
  if (!a.ok() || !b.ok() || !(*a)->listen("127.0.0.1:0").is_ok()) return -1;
  if (!(*b)->connect("127.0.0.1:" + std::to_string((*a)->listen_port())).is_ok()) return -1;
  auto pa = wait_for_peer(**b, "overhead-a", now_ns() + int64_t{10} * 1000000000);
  auto pb = wait_for_peer(**a, "overhead-b", now_ns() + int64_t{10} * 1000000000);
  if (!pa.ok() || !pb.ok()) return -1;
  auto in = FrameBuffer::create(a->get(), size), out = FrameBuffer::create(b->get(), size);
  if (!in.ok() || !out.ok()) return -1;
  std::memset(out->data(), 0x5a, size);
  const int64_t deadline = now_ns() + int64_t{600} * 1000000000;
  auto one = [&]() {
    auto r = (*a)->post_recv(*pb, 1, in->data(), size);
    auto s = (*b)->post_send(*pa, 1, out->data(), size);
    if (!r.ok() || !s.ok()) return false;
    return (*a)->wait(*r, deadline).status.is_ok() && (*b)->wait(*s, deadline).status.is_ok();
  };
  for (int i = 0; i < 1000; ++i) {
    if (!one()) return -1;
  }
  int64_t t0 = now_ns();
  for (int i = 0; i < iters; ++i) {
    if (!one()) return -1;
  }
  return static_cast<double>(now_ns() - t0) / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200000, repeat = 5;
  size_t size = 64;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--size" && i + 1 < argc) {
      size = std::stoull(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_comm_overhead [--iters N] [--repeat R] [--size B] [--only afd|ucp]\n");
      return 1;
    }
  }
  double best_ucp = -1, best_afd = -1;
  for (int rep = 0; rep < repeat; ++rep) {
    if (only.empty() || only == "ucp") {
      double v = run_ucp(size, iters);
      if (v > 0 && (best_ucp < 0 || v < best_ucp)) best_ucp = v;
    }
    if (only.empty() || only == "afd") {
      double v = run_afd(size, iters);
      if (v > 0 && (best_afd < 0 || v < best_afd)) best_afd = v;
    }
  }
  std::printf("one message of %zu B through UCX shared memory on one thread, ns (mean of %d, best of %d)\n", size, iters,
              repeat);
  std::printf("%12s | %12s | %12s\n", "bare ucp", "afd", "afd - ucp");
  std::printf("%12.1f | %12.1f | %12.1f\n", best_ucp, best_afd, best_afd > 0 && best_ucp > 0 ? best_afd - best_ucp : 0.0);
  return best_ucp > 0 || best_afd > 0 ? 0 : 1;
}
