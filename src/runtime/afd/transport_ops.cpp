#include "runtime/afd/transport_ops.h"

namespace afd {

bool cancel_and_wait(comm::Transport* t, comm::RequestId id, int64_t wait_ms) {
  t->cancel(id);
  return t->wait(id, deadline_in_ms(wait_ms)).status.code() != StatusCode::timeout;
}

comm::Completion wait_or_cancel(comm::Transport* t, comm::RequestId id, int64_t wait_ms, int64_t end_ms) {
  comm::Completion c = t->wait(id, deadline_in_ms(wait_ms));
  if (c.status.code() == StatusCode::timeout) cancel_and_wait(t, id, end_ms);
  return c;
}

}  // namespace afd
