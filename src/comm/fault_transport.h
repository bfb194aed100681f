// FaultTransport: wraps any Transport and, on command, drops, delays, stalls or corrupts
// the messages it sends, or drops a peer's connection — so the engine's failure paths are
// tested without real failures. With no fault armed it forwards everything unchanged.
//
// Faults act on sends from this side (a one-way effect); wrap both sides for both
// directions. `target` limits a fault to one peer (kNoPeer = every peer).
//   delay:   every send is held for delay_ns before it is forwarded (order preserved);
//            used to emulate network latency in benchmarks.
//   stall:   sends are held until the stall is lifted (the peer sees silence).
//   drop:    the next n sends (or each with probability p) vanish; the sender sees success.
//   corrupt: the next n sends are copied and random bytes of the copy are flipped.
//   disconnect(peer): the inner transport drops the connection (it reconnects as usual).
// Held sends belong to the connection they were posted on, as on a real wire: when that
// connection is lost — disconnect(peer) here, or a disconnected event seen through
// next_event — the peer's held sends fail (unavailable) instead of reaching its next
// connection later.
// Threading: all methods thread-safe; held sends are forwarded by the wrapper's own thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/request_table.h"
#include "comm/transport.h"

namespace afd::comm {

class FaultTransport final : public Transport {
 public:
  explicit FaultTransport(std::unique_ptr<Transport> inner, uint64_t seed = 1);
  ~FaultTransport() override;

  // ---- fault controls ----
  void set_delay_ns(int64_t delay_ns, PeerId target = kNoPeer);
  void set_stall(bool stalled, PeerId target = kNoPeer);
  void drop_next_sends(int n, PeerId target = kNoPeer);
  void set_drop_probability(double p, PeerId target = kNoPeer);
  // bytes_to_flip random bytes (anywhere in the message) per corrupted send.
  void corrupt_next_sends(int n, int bytes_to_flip = 4, PeerId target = kNoPeer);
  void clear_faults();
  Transport& inner() { return *inner_; }

  // ---- Transport ----
  const char* kind() const override { return kind_.c_str(); }
  TransportCaps caps() const override;
  const std::string& local_name() const override { return inner_->local_name(); }
  Status listen(const std::string& address) override { return inner_->listen(address); }
  Status connect(const std::string& address) override { return inner_->connect(address); }
  Result<PeerId> peer_id(const std::string& name) const override { return inner_->peer_id(name); }
  std::string peer_name(PeerId peer) const override { return inner_->peer_name(peer); }
  bool is_connected(PeerId peer) const override { return inner_->is_connected(peer); }
  bool next_event(PeerEvent* ev, int64_t deadline_ns) override;
  Result<RequestId> post_send(PeerId peer, uint64_t tag, const void* data, size_t len, CompletionFn on_done = {}) override;
  Result<RequestId> post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity, CompletionFn on_done = {}) override;
  bool test(RequestId id, Completion* out) override { return table_.test(id, out); }
  Completion wait(RequestId id, int64_t deadline_ns) override { return table_.wait(id, deadline_ns); }
  int wait_any(std::span<const RequestId> ids, int64_t deadline_ns) override { return table_.wait_any(ids, deadline_ns); }
  void cancel(RequestId id) override;
  void close() override;
  Result<MemoryRegion> register_memory(void* base, size_t size) override { return inner_->register_memory(base, size); }
  Status deregister_memory(const MemoryRegion& r) override { return inner_->deregister_memory(r); }
  Status disconnect(PeerId peer) override;
  Status stop_connecting(const std::string& address) override { return inner_->stop_connecting(address); }

 private:
  struct Held {
    RequestId outer;
    PeerId peer;
    uint64_t tag;
    const void* data;
    size_t len;
    int64_t due_ns;
    std::shared_ptr<std::vector<uint8_t>> copy;  // corrupted copy, when any
  };
  bool applies(PeerId target, PeerId peer) const { return target == kNoPeer || target == peer; }
  void forward(Held h);
  // Removes the held sends to `peer` and fails them with `why` (mu_ not held: it is taken to
  // remove them and released before completing them, as callbacks may post).
  void fail_held(PeerId peer, const std::string& why);
  void fault_loop();

  std::unique_ptr<Transport> inner_;
  std::string kind_;
  RequestTable table_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Held> held_;
  std::unordered_map<RequestId, RequestId> inner_of_;  // outer recv/send id -> inner id
  int64_t delay_ns_ = 0;
  PeerId delay_target_ = kNoPeer;
  bool stalled_ = false;
  PeerId stall_target_ = kNoPeer;
  int drop_n_ = 0;
  PeerId drop_target_ = kNoPeer;
  double drop_p_ = 0;
  PeerId drop_p_target_ = kNoPeer;
  int corrupt_n_ = 0;
  int corrupt_bytes_ = 4;
  PeerId corrupt_target_ = kNoPeer;
  std::mt19937_64 rng_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace afd::comm
