#include "runtime/afd/liveness.h"

namespace afd {

using namespace comm;

uint64_t probe_tag() { return frame_tag(TagFamily::probe, 0); }

Status ProbeBuffers::ensure(Transport* t) {
  if (ping.data() != nullptr) return Status::ok();
  AFD_ASSIGN_OR_RETURN(FrameBuffer a, FrameBuffer::create(t, kFrameHeaderBytes));
  AFD_ASSIGN_OR_RETURN(FrameBuffer b, FrameBuffer::create(t, kFrameHeaderBytes));
  ping = std::move(a);
  pong = std::move(b);
  return Status::ok();
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

}  // namespace afd
