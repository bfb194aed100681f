// Dead-peer detection. Each connection keeps its bootstrap socket open: its EOF or error
// is the peer's loss, checked at most every kLivenessPeriodNs while the progress thread or
// a waiter runs, and at once when the idle progress thread's epoll sees the socket. With
// UCP_ERR_HANDLING_MODE_PEER, a UCX endpoint error is a loss too (err_cb, deferred to the
// end of the pass: endpoints are closed outside ucp_worker_progress).
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "comm/ucx/transport_impl.h"
#include "core/log.h"

namespace afd::comm::ucx {

void UcxTransportImpl::check_liveness() {
  std::vector<pollfd> fds;
  std::vector<PeerId> who;
  const PeerId n = peer_count();
  for (PeerId i = 0; i < n; ++i) {
    if (peers_[i].fd >= 0) {
      fds.push_back(pollfd{peers_[i].fd, POLLIN | POLLRDHUP, 0});
      who.push_back(i);
    }
  }
  if (fds.empty()) return;
  if (::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t k = 0; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    char buf[64];
    ssize_t r = ::recv(fds[k].fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || (fds[k].revents & (POLLERR | POLLHUP | POLLRDHUP))) {
      lose_peer(who[k], peers_[who[k]].gen, r == 0 ? "connection closed" : "connection error");
    }
  }
}

void UcxTransportImpl::err_cb(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* a = static_cast<ErrArg*>(arg);
  a->self->failed_eps_.emplace_back(a->peer, a->gen);
  spdlog::debug("ucx: endpoint error for peer {}: {}", a->peer, ucs_status_string(status));
}

void UcxTransportImpl::handle_failed_endpoints() {
  if (failed_eps_.empty()) return;
  auto failed = std::move(failed_eps_);
  failed_eps_.clear();
  for (auto& [p, g] : failed) lose_peer(p, g, "UCX endpoint error");
}

}  // namespace afd::comm::ucx
