// Test helper: two connected transports of one kind ("inproc" or "ucx").
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "comm/inproc_transport.h"
#include "comm/transport.h"
#include "comm/ucx_transport.h"
#include "core/timer.h"

namespace afd::comm::testing {

inline int64_t deadline_in_ms(int64_t ms) { return now_ns() + ms * 1000000; }

struct Pair {
  std::shared_ptr<InprocHub> hub;    // inproc only
  std::unique_ptr<Transport> a, b;   // a listens ("server"), b connects ("client")
  std::string a_address;
  PeerId a_sees_b = kNoPeer, b_sees_a = kNoPeer;
};

inline std::unique_ptr<Transport> make_transport(const std::string& kind, const std::string& name,
                                                 std::shared_ptr<InprocHub> hub) {
  if (kind == "inproc") {
    auto t = InprocTransport::create(hub, name);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::unique_ptr<Transport>(std::move(t).value()) : nullptr;
  }
  UcxOptions o;
  o.name = name;
  auto t = UcxTransport::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::unique_ptr<Transport>(std::move(t).value()) : nullptr;
}

// Listens on an address the kind can use; returns it.
inline std::string listen_any(const std::string& kind, Transport& t) {
  if (kind == "inproc") {
    EXPECT_TRUE(t.listen("addr-" + t.local_name()).is_ok());
    return "addr-" + t.local_name();
  }
  EXPECT_TRUE(t.listen("127.0.0.1:0").is_ok());
  return "127.0.0.1:" + std::to_string(static_cast<UcxTransport&>(t).listen_port());
}

inline Pair make_pair(const std::string& kind) {
  Pair p;
  p.hub = std::make_shared<InprocHub>();
  p.a = make_transport(kind, "server", p.hub);
  p.b = make_transport(kind, "client", p.hub);
  p.a_address = listen_any(kind, *p.a);
  EXPECT_TRUE(p.b->connect(p.a_address).is_ok());
  auto x = wait_for_peer(*p.b, "server", deadline_in_ms(10000));
  auto y = wait_for_peer(*p.a, "client", deadline_in_ms(10000));
  EXPECT_TRUE(x.ok()) << x.status().to_string();
  EXPECT_TRUE(y.ok()) << y.status().to_string();
  if (x.ok()) p.b_sees_a = *x;
  if (y.ok()) p.a_sees_b = *y;
  return p;
}

}  // namespace afd::comm::testing
