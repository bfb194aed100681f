// wait / wait_any: a caller with nothing else to do drives the worker itself while it
// waits (a waiter, in worker_lock.h's terms), then hands progress back.
#include <limits>
#include <thread>

#include "comm/ucx/transport_impl.h"
#include "core/timer.h"

namespace afd::comm::ucx {

int UcxTransportImpl::wait_any(std::span<const RequestId> ids, int64_t deadline_ns) {
  int r = table_.poll_any(ids);
  if (r >= 0) return r;
  // The caller drives the worker for up to waiter_spin_ns, as ucx_perftest does (no thread
  // hand-off on the latency path). Meanwhile the progress thread stays parked off the CPU
  // (it never contends for the worker while a waiter is joined): with fewer free cores
  // than spinning threads, a second spinner per process would starve the peer process.
  //
  // The clock is read every kClockEvery turns only (a clock read costs about as much as an
  // idle progress call): the deadline and the spin limit are overshot by at most that
  // many turns, and the liveness sockets are checked at the first clock reading past due.
  constexpr uint32_t kClockEvery = 16;
  // Turns in a row that find the worker held by another thread before this waiter yields
  // its core instead of pausing (a pass over the worker takes well under a microsecond).
  constexpr uint32_t kHeldSpins = 64;
  // Past this much waiting, the waiter also yields its core at every clock reading (about
  // once a microsecond), so that a thread woken on its core (the peer process's caller,
  // woken from its condition variable) can run: a waiter that never yields keeps it off the
  // CPU until the spin limit, and two processes can then settle into a state where every
  // wait runs out its spin. Short waits, which complete well within this, never yield.
  constexpr int64_t kYieldAfterNs = 20000;
  uint32_t held_turns = 0;
  // The worker lock is kept from one turn to the next while nobody else asks for it
  // (wanted()) and this waiter does not yield: taking it is a locked exchange, which
  // drains the store buffer and so delays this turn's look at an arriving message. Posts
  // from other threads meanwhile go through the command queue, which the next turn runs.
  bool held = false;
  // Joined (WorkerLock::join) from the first clock reading on, so a wait that completes
  // within kClockEvery turns costs no locked add and subtract.
  bool joined = false;
  // The spin limit counts from the first clock reading (kClockEvery turns in), so a wait
  // that completes within those turns reads no clock at all.
  int64_t spin_until = std::numeric_limits<int64_t>::max();
  int64_t yield_from = std::numeric_limits<int64_t>::max();
  for (uint32_t turn = 1;; ++turn) {
    int64_t t = turn % kClockEvery == 0 ? now_ns() : 0;
    if (turn == kClockEvery) {
      spin_until = t + opt_.waiter_spin_ns;
      yield_from = t + kYieldAfterNs;
      lock_.join();
      joined = true;
    }
    // No pause after a progress call of our own: that call is the polling, as in
    // ucx_perftest, and a pause would delay noticing an arrival. Only while another thread
    // holds the worker.
    if (!held && (held = lock_.try_lock())) lock_.note_drive();
    if (held) {
      // Most turns have nothing but the worker to look at: call UCX directly then; the full
      // pass (progress_once) only for commands, failed endpoints, closing or a clock reading.
      if (n_deferred_ > 0) post_deferred();
      if (t == 0 && n_cmds_.load(std::memory_order_acquire) == 0 && failed_eps_.empty() && closing_.empty()) {
        ucp_worker_progress(worker_);
      } else {
        progress_once(t, false);
      }
    }
    r = table_.poll_any(ids);
    if (r >= 0) break;
    if (t != 0 && (t >= deadline_ns || t >= spin_until)) break;
    if (stop_.load(std::memory_order_relaxed)) break;
    held_turns = held ? 0 : held_turns + 1;
    // Past kYieldAfterNs; or another thread has held the worker for a while: it may be
    // preempted while holding it (more runnable threads than cores), and spinning here
    // keeps it off the CPU.
    bool yield = t >= yield_from || held_turns >= kHeldSpins;
    if (held && (yield || lock_.wanted())) {
      lock_.unlock();
      held = false;
    }
    if (yield) {
      std::this_thread::yield();
    } else if (!held) {
      cpu_relax();
    }
  }
  if (held) lock_.unlock();
  // Hand progress back when this caller gives up, or when operations it does not wait
  // for are still in flight (they must move while the caller computes).
  if (lock_.leave(joined) &&
      (r < 0 || n_live_.load(std::memory_order_acquire) > 0 || n_cmds_.load(std::memory_order_acquire) > 0)) {
    lock_.hand_off();
  }
  if (r >= 0) return r;
  return table_.wait_any(ids, deadline_ns);
}

Completion UcxTransportImpl::wait(RequestId id, int64_t deadline_ns) {
  // A finished id (a small send, typically) reads as done at once; any other id is looked
  // at first by wait_any's own poll, so a receive is tested once, when it is done.
  if (!RequestTable::is_finished_id(id)) {
    RequestId one[1] = {id};
    if (wait_any(one, deadline_ns) < 0) {
      return Completion{timeout_error("transport: operation did not finish before its deadline"), 0};
    }
  }
  Completion c;
  table_.test(id, &c);
  return c;
}

}  // namespace afd::comm::ucx
