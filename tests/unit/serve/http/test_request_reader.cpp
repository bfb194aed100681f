// RequestReader: HTTP/1.1 framing under the limits, fed whole and byte by byte.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/http/request_reader.h"

namespace afd::serve::http::test_request_reader {
namespace {

struct Fed {
  std::vector<Request> requests;
  int continues = 0;
  int error = 0;
  std::string message;
};

// Feeds `bytes` in pieces of `piece` bytes (0: whole), collecting what comes out.
Fed feed(const Limits& lim, const std::string& bytes, size_t piece = 0) {
  RequestReader r(lim);
  Fed out;
  size_t pos = 0;
  for (;;) {
    for (;;) {
      const auto e = r.next();
      if (e == RequestReader::Event::request) {
        out.requests.push_back(r.take());
      } else if (e == RequestReader::Event::send_continue) {
        ++out.continues;
      } else if (e == RequestReader::Event::error) {
        out.error = r.error().status;
        out.message = r.error().message;
        return out;
      } else {
        break;
      }
    }
    if (pos == bytes.size()) return out;
    const size_t n = piece == 0 ? bytes.size() : std::min(piece, bytes.size() - pos);
    r.append(bytes.data() + pos, n);
    pos += n;
  }
}

std::string chunked_post(const std::vector<std::string>& chunks) {
  std::string s = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  char hex[32];
  for (const auto& c : chunks) {
    std::snprintf(hex, sizeof hex, "%zx\r\n", c.size());
    s += hex + c + "\r\n";
  }
  return s + "0\r\n\r\n";
}

TEST(RequestReader, PipelinedRequestsComeOutInOrderWhateverTheSplit) {
  const std::string bytes =
      "GET /a?x=1 HTTP/1.1\r\nHost: h\r\nX-Custom: v\r\n\r\n"
      "POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
      "\r\n"  // a stray empty line between requests is ignored
      + chunked_post({"wor", "ld"}) + "GET /c HTTP/1.1\r\nConnection: close\r\n\r\n";
  for (size_t piece : {size_t{0}, size_t{1}, size_t{3}, size_t{7}}) {
    Fed f = feed(Limits{}, bytes, piece);
    ASSERT_EQ(f.error, 0) << f.message << " piece " << piece;
    ASSERT_EQ(f.requests.size(), 4u) << "piece " << piece;
    EXPECT_EQ(f.requests[0].method, "GET");
    EXPECT_EQ(f.requests[0].target, "/a?x=1");
    EXPECT_EQ(f.requests[0].path, "/a");
    EXPECT_EQ(f.requests[0].get_header_value("x-custom"), "v");  // any case
    EXPECT_TRUE(f.requests[0].keep_alive);
    EXPECT_EQ(f.requests[1].body, "hello");
    EXPECT_EQ(f.requests[2].body, "world");
    EXPECT_EQ(f.requests[3].path, "/c");
    EXPECT_FALSE(f.requests[3].keep_alive);
  }
}

TEST(RequestReader, ChunkedBodyOverTheLimitIs413WhateverTheChunkSizes) {
  Limits lim;
  lim.max_body_bytes = 1000;
  // Many small chunks that add up past the limit, and one large chunk.
  Fed many = feed(lim, chunked_post(std::vector<std::string>(20, std::string(60, 'a'))), 5);
  EXPECT_EQ(many.error, 413);
  EXPECT_NE(many.message.find("--max-body"), std::string::npos) << many.message;
  EXPECT_TRUE(many.requests.empty());
  EXPECT_EQ(feed(lim, chunked_post({std::string(1001, 'b')})).error, 413);
  // Exactly at the limit is accepted.
  Fed at = feed(lim, chunked_post({std::string(600, 'c'), std::string(400, 'd')}));
  ASSERT_EQ(at.error, 0) << at.message;
  EXPECT_EQ(at.requests.at(0).body.size(), 1000u);
  // A declared Content-Length over the limit is refused before any body byte arrives.
  EXPECT_EQ(feed(lim, "POST /x HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n").error, 413);
}

TEST(RequestReader, PostWithoutLengthIs411AtTheEndOfItsHeader) {
  Fed f = feed(Limits{}, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(f.error, 411);
  EXPECT_NE(f.message.find("Content-Length"), std::string::npos);
  // GET without a body needs none.
  EXPECT_EQ(feed(Limits{}, "GET /health HTTP/1.1\r\n\r\n").requests.size(), 1u);
}

TEST(RequestReader, HeaderSizeCountAndTargetLimits) {
  Limits lim;
  lim.max_header_bytes = 2048;
  lim.max_headers = 10;
  lim.max_target_bytes = 256;
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 11; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  Fed count = feed(lim, many + "\r\n", 4);
  EXPECT_EQ(count.error, 431);
  EXPECT_NE(count.message.find("--http-max-headers"), std::string::npos) << count.message;
  Fed size = feed(lim, "GET / HTTP/1.1\r\nX-Big: " + std::string(4000, 'v') + "\r\n\r\n", 100);
  EXPECT_EQ(size.error, 431);
  EXPECT_NE(size.message.find("--http-max-header-bytes"), std::string::npos) << size.message;
  // A target over the limit, complete or still arriving.
  Fed target = feed(lim, "GET /" + std::string(300, 'p') + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(target.error, 414);
  EXPECT_NE(target.message.find("--http-max-target"), std::string::npos) << target.message;
  EXPECT_EQ(feed(lim, "GET /" + std::string(1000, 'p'), 50).error, 414);
  // A header that never ends is refused once it is over the limit, not buffered forever.
  EXPECT_EQ(feed(lim, "GET / HTTP/1.1\r\nX: " + std::string(100000, 'v'), 1000).error, 431);
}

TEST(RequestReader, EndlessChunkSizeLineIsBounded) {
  Limits lim;
  lim.max_header_bytes = 1024;
  std::string s = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=";
  Fed f = feed(lim, s + std::string(5000, 'e'), 100);
  EXPECT_EQ(f.error, 431);
}

TEST(RequestReader, AmbiguousFramingIsRefused) {
  // Content-Length and chunked together (request smuggling), a coding this server does not
  // decode, two different lengths: refused, never guessed.
  EXPECT_EQ(feed(Limits{}, "POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc").error, 400);
  EXPECT_EQ(feed(Limits{}, "POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").error, 501);
  EXPECT_EQ(feed(Limits{}, "POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").error, 501);
  EXPECT_EQ(feed(Limits{}, "POST /x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd").error, 400);
  EXPECT_EQ(feed(Limits{}, "GET / HTTP/2.0\r\n\r\n").error, 400);
  EXPECT_EQ(feed(Limits{}, "\x01\x02garbage\r\n\r\n").error, 400);
}

TEST(RequestReader, ExpectContinueIsSignalledOnceBeforeTheBody) {
  const std::string head = "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
  Fed waiting = feed(Limits{}, head);
  EXPECT_EQ(waiting.continues, 1);
  EXPECT_TRUE(waiting.requests.empty());
  // The body already sent with the header: nobody waits for the 100.
  Fed sent = feed(Limits{}, head + "abcd");
  EXPECT_EQ(sent.continues, 0);
  ASSERT_EQ(sent.requests.size(), 1u);
  EXPECT_EQ(sent.requests[0].body, "abcd");
  // Fed in pieces: one 100, then the request.
  Fed pieces = feed(Limits{}, head + "abcd", head.size());
  EXPECT_EQ(pieces.continues, 1);
  EXPECT_EQ(pieces.requests.size(), 1u);
  // HTTP/1.0 has no 100 Continue.
  EXPECT_EQ(feed(Limits{}, "POST /x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n").continues, 0);
}

TEST(RequestReader, Http10ClosesUnlessKeepAlive) {
  Fed f = feed(Limits{}, "GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  ASSERT_EQ(f.requests.size(), 2u);
  EXPECT_EQ(f.requests[0].version, 10);
  EXPECT_FALSE(f.requests[0].keep_alive);
  EXPECT_TRUE(f.requests[1].keep_alive);
}

TEST(RequestReader, KeepsNoMemoryFromPastRequests) {
  Limits lim;
  lim.max_body_bytes = 4 << 20;
  RequestReader r(lim);
  const std::string big = "POST /x HTTP/1.1\r\nContent-Length: 3000000\r\n\r\n" + std::string(3000000, 'z');
  r.append(big.data(), big.size());
  ASSERT_EQ(r.next(), RequestReader::Event::request);
  Request q = r.take();
  EXPECT_EQ(q.body.size(), 3000000u);
  EXPECT_EQ(r.next(), RequestReader::Event::need_more);
  EXPECT_TRUE(r.idle());
  r.release_memory();
  EXPECT_EQ(r.capacity(), 0u);
  // A partial next request stays, in a buffer its own size.
  const std::string part = "GET /yy";  // an incomplete request line stays unparsed
  r.append(part.data(), part.size());
  EXPECT_EQ(r.next(), RequestReader::Event::need_more);
  EXPECT_FALSE(r.idle());
  EXPECT_FALSE(r.header_done());
  r.release_memory();
  EXPECT_LT(r.capacity(), size_t{64} << 10);
  EXPECT_EQ(r.buffered(), part.size());
}

}  // namespace
}  // namespace afd::serve::http::test_request_reader
