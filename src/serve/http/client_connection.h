// The client side of an HTTP exchange, seen from inside a handler: whether the client is
// still connected. A handler that waits a long time before answering (a non-streaming
// generation, or the front end waiting for an attention worker) polls peer_closed() on
// connection_socket() to cancel work nobody will read.
#pragma once

#include "serve/http/message.h"

namespace afd::serve {

// The server-side socket of the connection `req` arrived on, or -1 (a request not from a
// server). The server neither reads nor closes it while the handler runs.
inline int connection_socket(const http::Request& req) { return req.socket; }

// Whether the client has closed (or shut down the sending side of) the connection on fd. A
// request is complete when its handler runs, so readable data is a pipelined next request
// and means the client is still there; end of stream or an error means it is gone.
bool peer_closed(int fd);

}  // namespace afd::serve
