// FrameBuffer: a 64-byte aligned buffer for frames, registered with a transport once at
// creation and deregistered when destroyed ("prepare once, post every step").
// Not copyable; the transport must outlive it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "comm/transport.h"

namespace afd::comm {

class FrameBuffer {
 public:
  FrameBuffer() = default;
  FrameBuffer(const FrameBuffer&) = delete;
  FrameBuffer& operator=(const FrameBuffer&) = delete;
  FrameBuffer(FrameBuffer&& o) noexcept { *this = std::move(o); }
  FrameBuffer& operator=(FrameBuffer&& o) noexcept {
    release();
    data_ = o.data_;
    cap_ = o.cap_;
    region_ = o.region_;
    transport_ = o.transport_;
    o.data_ = nullptr;
    o.transport_ = nullptr;
    o.cap_ = 0;
    return *this;
  }
  ~FrameBuffer() { release(); }

  // Allocates `capacity` bytes and registers them with `t` when it supports registration
  // (not_supported is fine: the buffer is then used unregistered).
  static Result<FrameBuffer> create(Transport* t, size_t capacity) {
    FrameBuffer b;
    size_t rounded = (capacity + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    b.data_ = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
    if (b.data_ == nullptr) return resource_exhausted("cannot allocate a " + std::to_string(rounded) + "-byte frame buffer");
    b.cap_ = rounded;
    auto r = t->register_memory(b.data_, rounded);
    if (r.ok()) {
      b.region_ = *r;
      b.transport_ = t;
    } else if (r.status().code() != StatusCode::not_supported) {
      return r.status();
    }
    return b;
  }

  uint8_t* data() const { return data_; }
  size_t capacity() const { return cap_; }

 private:
  void release() {
    if (transport_ != nullptr) (void)transport_->deregister_memory(region_);
    std::free(data_);
    data_ = nullptr;
    transport_ = nullptr;
  }
  uint8_t* data_ = nullptr;
  size_t cap_ = 0;
  MemoryRegion region_;
  Transport* transport_ = nullptr;
};

}  // namespace afd::comm
