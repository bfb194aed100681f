// In-process transport: peers are other InprocTransports attached to the same InprocHub
// (the single-process bundle and tests). A send is copied once, directly from the
// sender's buffer into the receiver's posted buffer (no staging copy: a send waits,
// referencing the sender's memory, until the matching receive is posted — rendezvous).
//
// Addresses are names: listen(name) makes this transport reachable as `name`;
// connect(name) links to the transport listening there, now or when it appears, and
// again after a loss (checked every reconnect_interval_ms on the progress thread).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/request_table.h"
#include "comm/transport.h"

namespace afd::comm {

class InprocTransport;
struct InprocPort;

// The rendezvous point of in-process transports. Thread-safe; outlives its transports.
class InprocHub {
 public:
  InprocHub() = default;
  InprocHub(const InprocHub&) = delete;
  InprocHub& operator=(const InprocHub&) = delete;

 private:
  friend class InprocTransport;
  std::mutex mu_;
  std::unordered_map<std::string, InprocTransport*> listeners_;  // by address
  std::unordered_map<std::string, InprocTransport*> by_name_;    // open transports
};

struct InprocOptions {
  int64_t spin_ns = 20000;  // waiters poll this long before sleeping
  int reconnect_interval_ms = 20;
};

class InprocTransport final : public Transport {
 public:
  // invalid_argument if `name` is empty or already open on this hub.
  static Result<std::unique_ptr<InprocTransport>> create(std::shared_ptr<InprocHub> hub, std::string name,
                                                         InprocOptions opt = {});
  ~InprocTransport() override;

  const char* kind() const override { return "inproc"; }
  TransportCaps caps() const override;
  const std::string& local_name() const override { return name_; }
  Status listen(const std::string& address) override;
  Status connect(const std::string& address) override;
  Result<PeerId> peer_id(const std::string& name) const override;
  std::string peer_name(PeerId peer) const override;
  bool is_connected(PeerId peer) const override;
  bool next_event(PeerEvent* ev, int64_t deadline_ns) override;
  Result<RequestId> post_send(PeerId peer, uint64_t tag, const void* data, size_t len, CompletionFn on_done = {}) override;
  Result<RequestId> post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity, CompletionFn on_done = {}) override;
  bool test(RequestId id, Completion* out) override { return table_->test(id, out); }
  Completion wait(RequestId id, int64_t deadline_ns) override { return table_->wait(id, deadline_ns); }
  int wait_any(std::span<const RequestId> ids, int64_t deadline_ns) override { return table_->wait_any(ids, deadline_ns); }
  void cancel(RequestId id) override;
  void close() override;
  // Registration is a no-op in one address space; the region is returned as given.
  Result<MemoryRegion> register_memory(void* base, size_t size) override { return MemoryRegion{base, size, 0}; }
  Status deregister_memory(const MemoryRegion&) override { return Status::ok(); }
  Status disconnect(PeerId peer) override;

 private:
  struct PeerLink {
    std::string name;
    std::shared_ptr<InprocPort> remote;  // null while disconnected
    PeerId my_id_there = kNoPeer;        // the PeerId the remote gave us (its receive key)
    std::string address;                 // the remote's listen address ("" if it connected to us)
  };
  struct Command {
    enum Kind : uint8_t { send, recv, cancel } kind;
    RequestId id;
    PeerId peer;
    uint64_t tag;
    void* buf;
    size_t len;
  };

  InprocTransport(std::shared_ptr<InprocHub> hub, std::string name, InprocOptions opt);
  void progress_loop();
  void do_send(const Command& c);
  void do_recv(const Command& c);
  void do_cancel(const Command& c);
  void try_reconnect();
  PeerId intern_peer(const std::string& name);  // peers_mu_ held
  // Links a and b (hub mutex held).
  static void link(InprocTransport* a, InprocTransport* b, const std::string& address_of_b);
  // The link to `peer` is gone; fails receives posted for it. Hub mutex held.
  void on_peer_lost(PeerId peer, const std::string& why);
  void push_event(PeerEvent ev);
  Result<RequestId> enqueue(Command c, CompletionFn on_done);

  std::shared_ptr<InprocHub> hub_;
  std::string name_;
  InprocOptions opt_;
  std::shared_ptr<RequestTable> table_;
  std::shared_ptr<InprocPort> port_;

  mutable std::mutex peers_mu_;
  std::vector<PeerLink> peers_;
  std::unordered_map<std::string, PeerId> peer_ids_;
  std::vector<std::string> wanted_;  // addresses to stay connected to
  std::string listen_address_;

  std::mutex cmd_mu_;
  std::condition_variable cmd_cv_;
  std::deque<Command> cmds_;
  bool stop_ = false;
  bool closed_ = false;
  std::thread progress_;

  PeerEventQueue events_;
};

}  // namespace afd::comm
