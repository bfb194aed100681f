#include <gtest/gtest.h>

#include "serve/frontend/sse_reader.h"

namespace afd::serve::test_sse_reader {
namespace {

std::vector<SseEvent> feed_all(SseReader& r, const std::string& s, size_t piece) {
  std::vector<SseEvent> out;
  for (size_t i = 0; i < s.size(); i += piece) EXPECT_TRUE(r.feed(std::string_view(s).substr(i, piece), &out).is_ok());
  return out;
}

// Events come out whole however the bytes are cut: data lines joined, comments (keep-alives)
// as events without data, CRLF and CR line ends, a field without a space after the colon.
TEST(SseReader, EventsWholeAtEveryCut) {
  const std::string s =
      "data: {\"a\":1}\n\n: ping\n\ndata: one\ndata: two\n\nevent: x\ndata:tight\r\n\r\ndata: cr\r\rdata: tail";
  for (size_t piece = 1; piece <= s.size(); ++piece) {
    SseReader r;
    auto evs = feed_all(r, s, piece);
    ASSERT_EQ(evs.size(), 5u) << piece;
    EXPECT_EQ(evs[0].data, "{\"a\":1}");
    EXPECT_TRUE(evs[0].has_data);
    EXPECT_FALSE(evs[1].has_data);  // the keep-alive
    EXPECT_EQ(evs[2].data, "one\ntwo");
    EXPECT_EQ(evs[3].data, "tight");
    EXPECT_EQ(evs[4].data, "cr");
  }
}

// An unfinished event is held (the connection may be cut in its middle: it never comes out),
// and one that grows past the bound is refused.
TEST(SseReader, PartialEventHeldAndOversizedRefused) {
  SseReader r;
  std::vector<SseEvent> out;
  ASSERT_TRUE(r.feed("data: {\"text\":\"ab", &out).is_ok());
  EXPECT_TRUE(out.empty());
  SseReader small(16);
  Status s = small.feed("data: " + std::string(64, 'x'), &out);
  EXPECT_EQ(s.code(), StatusCode::resource_exhausted);
  EXPECT_FALSE(small.feed("\n\n", &out).is_ok());
}

}  // namespace
}  // namespace afd::serve::test_sse_reader
