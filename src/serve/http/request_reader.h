// RequestReader: the bytes one connection receives, turned into requests under the Limits.
// No I/O: the connection appends what it read and asks for the next event. Requests that
// arrive back to back (HTTP/1.1 pipelining) stay in the buffer and come out one by one, in
// order. Framing is Boost.Beast's HTTP/1 parser (Content-Length, chunked, trailers);
// everything else — limits, 100-continue, the buffer — is here. After an error the
// connection cannot be trusted to be at a message boundary and must be closed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "serve/http/limits.h"
#include "serve/http/message.h"

namespace afd::serve::http {

// An answer the reader decided on its own (the request never reaches a handler).
struct ReadError {
  int status = 400;     // 400, 411, 413, 414, 431, 501
  std::string message;  // names the limit (and its flag) or what is malformed
};

class RequestReader {
 public:
  explicit RequestReader(const Limits& limits);
  ~RequestReader();
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  // Room for n more bytes at the end of the buffer; commit(k <= n) keeps the first k of them.
  char* prepare(size_t n);
  void commit(size_t n);
  void append(const char* data, size_t n);

  enum class Event {
    need_more,      // read more bytes (and check the deadline: idle(), header_done())
    send_continue,  // the client sent "Expect: 100-continue" and waits for 100 before its body
    request,        // take() the next complete request
    error,          // error(): answer it and close
  };
  Event next();
  Request take();
  const ReadError& error() const { return error_; }

  // No byte of a next request has arrived (between requests, or before the first).
  bool idle() const;
  // The request being read has a complete header (its body is being read).
  bool header_done() const;
  // Bytes received and not yet parsed, and what the buffer holds on to.
  size_t buffered() const { return buf_.size() - start_; }
  size_t capacity() const { return buf_.capacity(); }
  // Frees the buffer when nothing is buffered, or shrinks one that grew far beyond what it
  // holds: a connection keeps no memory from past requests while it waits.
  void release_memory();
  // Drops everything buffered and the request being read (the connection is ending).
  void discard();

  class Parser;  // request_reader.cpp

 private:
  void fail(int status, std::string message);
  std::string chunk_limit_message() const;
  void compact();

  Limits limits_;
  std::vector<char> buf_;
  size_t start_ = 0;  // buf_[start_, size) is unparsed
  size_t prepared_at_ = 0;  // where prepare()'s room begins
  std::unique_ptr<Parser> parser_;  // the request being read; null between requests
  std::unique_ptr<Request> ready_;
  ReadError error_;
  bool failed_ = false;
};

}  // namespace afd::serve::http
