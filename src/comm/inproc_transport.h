// In-process transport: peers are other InprocTransports attached to the same InprocHub
// (the single-process bundle and tests). A send is copied once, directly from the
// sender's buffer into the receiver's posted buffer (no staging copy: a send waits,
// referencing the sender's memory, until the matching receive is posted — rendezvous).
//
// Who runs an operation: the posting thread itself, unless an earlier operation of the
// same direction is still queued or it is a send of more than kInlineCopyMax bytes; those
// go to the transport's progress thread. A hand-off costs a futex wake and a context
// switch, far more than copying kInlineCopyMax bytes, and a large send's copy stays off
// the sender's compute path. A receive always runs inline: when it
// matches a send that is already waiting, the receiver copies (it is about to wait for
// those bytes anyway). Either way a thread's sends (and its receives) to one (peer, tag)
// match in the order it posted them. Completions, and the callbacks they run, happen with
// no transport lock held, on whichever thread matched the pair.
//
// Addresses are names: listen(name) makes this transport reachable as `name`;
// connect(name) links to the transport listening there, now or when it appears, and
// again after a loss (checked every reconnect_interval_ms on the progress thread).
#pragma once

#include <atomic>
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
  // Largest send a posting thread copies itself (see the file comment).
  static constexpr size_t kInlineCopyMax = 16 * 1024;

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
  Status deregister_memory(const MemoryRegion&) override { return Status(); }
  Status disconnect(PeerId peer) override;
  Status stop_connecting(const std::string& address) override;

 private:
  struct PeerLink {
    std::string name;
    std::shared_ptr<InprocPort> remote;  // null while disconnected
    PeerId my_id_there = kNoPeer;        // the PeerId the remote gave us (its receive key)
    std::string address;                 // the remote's listen address ("" if it connected to us)
    uint64_t epoch_there = 0;            // the remote port's link epoch for us when linked
    uint64_t epoch_here = 0;             // our port's link epoch for this peer when linked
  };
  struct Command {
    enum Kind : uint8_t { send, recv, cancel } kind;
    RequestId id;
    PeerId peer;
    uint64_t tag;
    void* buf;
    size_t len;
  };
  // Completions decided under a port lock, delivered after it is released (at most two per
  // operation: the local request and the matched remote one).
  struct Finishes {
    struct One {
      RequestTable* table;
      std::shared_ptr<RequestTable> keep;  // holds a peer's table alive until delivery
      RequestId id;
      Completion c;
    };
    One items[2];
    int n = 0;
    void add(RequestTable* t, std::shared_ptr<RequestTable> keep, RequestId id, Completion c) {
      items[n++] = One{t, std::move(keep), id, std::move(c)};
    }
    void deliver() {
      for (int i = 0; i < n; ++i) items[i].table->complete(items[i].id, std::move(items[i].c));
      n = 0;
    }
  };

  InprocTransport(std::shared_ptr<InprocHub> hub, std::string name, InprocOptions opt);
  void progress_loop();
  // Run an operation, on the posting thread or the progress thread; completions go to f.
  void do_send(const Command& c, Finishes& f);
  void do_recv(const Command& c, Finishes& f);
  void do_cancel(const Command& c);
  void run(const Command& c, Finishes& f);  // dispatches on c.kind
  void run_queued(const Command& c);         // run() on the progress thread, then uncounts c
  void try_reconnect();
  PeerId intern_peer(const std::string& name);  // peers_mu_ held
  // Links a and b (hub mutex held).
  static void link(InprocTransport* a, InprocTransport* b, const std::string& address_of_b);
  // The link to `peer` is gone; fails receives posted for it. Hub mutex held.
  // closing: the loss is part of a close() (this transport's or the peer's): logged as info.
  void on_peer_lost(PeerId peer, const std::string& why, bool closing = false);
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
  // Operations of each direction queued and not yet run by the progress thread: a post
  // runs inline only when its direction's count is 0 (keeps per-(peer, tag) order).
  std::atomic<int> queued_sends_{0}, queued_recvs_{0};
  // Inline posts under way; close() waits for them after setting stop_ (Dekker pair:
  // a post either sees stop_ or close() sees it in this count).
  std::atomic<int> inline_posts_{0};
  std::atomic<bool> stop_{false};
  bool closed_ = false;
  std::thread progress_;

  PeerEventQueue events_;
};

}  // namespace afd::comm
