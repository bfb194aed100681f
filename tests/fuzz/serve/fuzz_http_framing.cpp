// libFuzzer target for the HTTP request framing every afd server reads with
// (serve/http/request_reader.h): arbitrary bytes — pipelined, chunked, truncated — fed in
// arbitrary pieces, as a connection would receive them. The first input byte picks small
// limits and the piece sizes, so that every limit is reached often. Nothing may crash, and
// whatever is accepted must be within the limits: a body over the body limit, a header over
// its size or count, a target over its length, or a buffer that keeps growing while the
// reader waits for more is a bug (abort). The same bytes fed whole must give the same
// requests (the split must not change the framing).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

#include "serve/http/request_reader.h"

using afd::serve::http::Limits;
using afd::serve::http::Request;
using afd::serve::http::RequestReader;

namespace {

[[noreturn]] void fail(const char* what, size_t a, size_t b) {
  std::fprintf(stderr, "fuzz_http_framing: %s (%zu vs %zu)\n", what, a, b);
  std::abort();
}

struct Outcome {
  std::vector<std::string> requests;  // method target body, per request
  int error = 0;
};

// Feeds `in` in pieces of the sizes `piece(i)` gives, collecting requests until an error.
template <class Piece>
Outcome feed(const Limits& lim, const uint8_t* in, size_t size, Piece piece) {
  RequestReader r(lim);
  Outcome out;
  size_t pos = 0, last = 0;
  for (size_t i = 0;; ++i) {
    bool waiting = false;
    while (!waiting) {
      switch (r.next()) {
        case RequestReader::Event::request: {
          Request q = r.take();
          if (q.body.size() > lim.max_body_bytes) fail("body over the limit", q.body.size(), lim.max_body_bytes);
          if (q.target.size() > lim.max_target_bytes) fail("target over the limit", q.target.size(), lim.max_target_bytes);
          if (q.headers.size() > static_cast<size_t>(lim.max_headers))
            fail("more header fields than the limit", q.headers.size(), static_cast<size_t>(lim.max_headers));
          out.requests.push_back(q.method + " " + q.target + " " + q.body);
          break;
        }
        case RequestReader::Event::send_continue:
          break;
        case RequestReader::Event::error: {
          const int st = r.error().status;
          if (st != 400 && st != 411 && st != 413 && st != 414 && st != 431 && st != 501)
            fail("unexpected error status", static_cast<size_t>(st), 0);
          if (r.error().message.empty()) fail("error without a message", 0, 0);
          out.error = st;
          return out;
        }
        case RequestReader::Event::need_more: {
          // Waiting: what stays buffered is bounded by the limits plus the last piece.
          const size_t bound = lim.max_header_bytes + lim.max_target_bytes + 64 + last;
          if (r.buffered() > bound) fail("buffer grows while waiting", r.buffered(), bound);
          waiting = true;
          break;
        }
      }
    }
    if (pos >= size) break;
    last = std::min(size - pos, piece(i));
    r.append(reinterpret_cast<const char*>(in + pos), last);
    pos += last;
  }
  r.release_memory();
  if (r.buffered() == 0 && r.capacity() != 0) fail("idle buffer kept", r.capacity(), 0);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const uint8_t seed = data[1];
  data += 2;
  size -= 2;
  Limits lim;
  // Small limits half of the time, so that the fuzzer reaches them with short inputs.
  if (mode & 1) {
    lim.max_body_bytes = 16 + (mode >> 1) * 4;
    lim.max_header_bytes = 64 + (mode >> 2) * 8;
    lim.max_headers = 1 + (mode >> 4);
    lim.max_target_bytes = 8 + (mode >> 3) * 2;
  }
  // Pieces of 1..32 bytes from the seed, as a slow or fragmenting client sends them.
  uint32_t x = seed * 2654435761u + 1;
  auto random_piece = [&x](size_t) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return static_cast<size_t>(1 + x % 32);
  };
  const Outcome split = feed(lim, data, size, random_piece);
  const Outcome whole = feed(lim, data, size, [size](size_t) { return size == 0 ? size_t{1} : size; });
  // The requests accepted must agree. Which defect of a bad request is found first, and
  // whether a truncated bad request is found bad before its header ends, may depend on how
  // much had arrived; but a request one run refused is never accepted by the other, and
  // without an error both accept the same requests.
  const size_t n = std::min(split.requests.size(), whole.requests.size());
  for (size_t i = 0; i < n; ++i)
    if (split.requests[i] != whole.requests[i]) fail("request differs between piecewise and whole input", i, n);
  if (whole.error != 0 && split.requests.size() > whole.requests.size())
    fail("piecewise input accepted a request the whole input refused", split.requests.size(), whole.requests.size());
  if (split.error != 0 && whole.requests.size() > split.requests.size())
    fail("whole input accepted a request the piecewise input refused", whole.requests.size(), split.requests.size());
  if (split.error == 0 && whole.error == 0 && split.requests.size() != whole.requests.size())
    fail("piecewise and whole input framed differently", split.requests.size(), whole.requests.size());
  return 0;
}
