// Transport housekeeping the AFD client and worker share: deadlines in now_ns() time, and
// ending an operation that will not be needed (before its buffer is reused or released).
#pragma once

#include <cstdint>

#include "comm/transport.h"
#include "core/timer.h"

namespace afd {

// now_ns() + ms milliseconds: a deadline for Transport::wait / wait_any.
inline int64_t deadline_in_ms(int64_t ms) { return now_ns() + ms * 1000000; }

// Cancels operation `id` and waits up to wait_ms for it to end. False if it did not end
// (its buffer must then not be reused yet).
bool cancel_and_wait(comm::Transport* t, comm::RequestId id, int64_t wait_ms = 1000);

// The same for an operation tracked by a flag: nothing when !*live; *live becomes false.
inline bool end_op(comm::Transport* t, comm::RequestId id, bool* live, int64_t wait_ms = 1000) {
  if (!*live) return true;
  *live = false;
  return cancel_and_wait(t, id, wait_ms);
}

// Waits up to wait_ms for operation `id`; on a timeout cancels it and waits up to end_ms
// for it to end. Returns the completion of the first wait.
comm::Completion wait_or_cancel(comm::Transport* t, comm::RequestId id, int64_t wait_ms, int64_t end_ms = 1000);

}  // namespace afd
