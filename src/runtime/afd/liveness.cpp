#include "runtime/afd/liveness.h"

#include "runtime/afd/transport_ops.h"

namespace afd {

using namespace comm;

uint64_t probe_tag() { return frame_tag(TagFamily::probe, 0); }

Status ProbeBuffers::ensure(Transport* t) {
  if (ping.data() != nullptr) return Status();
  AFD_ASSIGN_OR_RETURN(FrameBuffer a, FrameBuffer::create(t, kFrameHeaderBytes));
  AFD_ASSIGN_OR_RETURN(FrameBuffer b, FrameBuffer::create(t, kFrameHeaderBytes));
  ping = std::move(a);
  pong = std::move(b);
  return Status();
}

size_t write_ping(ProbeBuffers& b, uint64_t seq) { return encode_probe(FrameKind::ping, seq, b.ping.data()); }

Result<uint64_t> read_ping(const ProbeBuffers& b, size_t bytes) {
  return decode_probe(b.ping.data(), bytes, FrameKind::ping);
}

size_t write_pong(ProbeBuffers& b, uint64_t seq) { return encode_probe(FrameKind::pong, seq, b.pong.data()); }

PongVerdict judge_pong(const Completion& c, const ProbeBuffers& b, uint64_t seq, std::string* why) {
  if (!c.status.is_ok()) return PongVerdict::lost;
  auto got = decode_probe(b.pong.data(), c.bytes, FrameKind::pong);
  if (got.ok() && *got == seq) return PongVerdict::answered;
  if (!got.ok() && why != nullptr) *why = got.status().message();
  return PongVerdict::owed;
}

PeerProbe::Reaped PeerProbe::reap(Transport* t, int64_t now, int64_t interval_ns, int64_t timeout_ms) {
  Reaped r;
  Completion c;
  if (ping_live && t->test(ping_id, &c)) ping_live = false;
  if (pong_live && t->test(pong_id, &c)) {
    pong_live = false;
    auto settle = [&] {
      overdue = false;
      sent_ns.store(0);
      next_ns = now + interval_ns;
    };
    switch (judge_pong(c, buf, seq, &r.bad_pong)) {
      case PongVerdict::answered:
        r.answered = true;
        r.back = overdue;
        r.back_after_ms = (now - sent_ns.load()) / 1000000;
        settle();
        answered.fetch_add(1);
        break;
      case PongVerdict::lost:  // the connection's loss is reported elsewhere: probe again after it
        settle();
        break;
      case PongVerdict::owed: {
        auto again = t->post_recv(peer, probe_tag(), buf.pong.data(), buf.pong.capacity());
        if (again.ok()) {
          pong_id = *again;
          pong_live = true;
        } else {
          settle();
        }
        break;
      }
    }
  }
  if (pong_live && !overdue && probe_overdue(sent_ns.load(), now, timeout_ms)) {
    overdue = true;
    r.became_overdue = true;
  }
  return r;
}

bool PeerProbe::ping(Transport* t, PeerId to, int64_t now, int64_t interval_ns) {
  next_ns = now + interval_ns;
  if (to == kNoPeer || !t->is_connected(to)) return false;
  auto r = t->post_recv(to, probe_tag(), buf.pong.data(), buf.pong.capacity());
  if (!r.ok()) return false;
  const size_t len = write_ping(buf, ++seq);
  auto sd = t->post_send(to, probe_tag(), buf.ping.data(), len);
  if (!sd.ok()) {
    cancel_and_wait(t, *r);
    return false;
  }
  peer = to;
  pong_id = *r;
  ping_id = *sd;
  pong_live = ping_live = true;
  sent_ns.store(now);
  return true;
}

void PeerProbe::stop(Transport* t) {
  end_op(t, pong_id, &pong_live);
  end_op(t, ping_id, &ping_live);
}

}  // namespace afd
