// The client side of an HTTP exchange, seen from inside a cpp-httplib handler: whether the
// client is still connected. cpp-httplib 0.11 (Debian 12) gives handlers neither the socket
// nor Request::is_connection_closed, so a handler that waits a long time before answering
// (a non-streaming generation, or the front end waiting for an attention worker) finds its
// socket with connection_socket() and polls peer_closed() to cancel work nobody will read.
#pragma once

namespace httplib {
struct Request;
}

namespace afd::serve {

// The server-side socket of the connection `req` arrived on, or -1. The connection is found
// by its address pair among this process's sockets: the TCP 4-tuple is unique, and the
// socket cannot be closed or reused while its handler runs (httplib closes it after the
// handler returns). A client in this same process holds the mirror socket (its peer is our
// local address), which the local-address check excludes. Cost: one scan of /proc/self/fd.
int connection_socket(const httplib::Request& req);

// Whether the client has closed (or shut down the sending side of) the connection on fd. A
// request is complete when its handler runs, so readable data is a pipelined next request
// and means the client is still there; end of stream or an error means it is gone.
bool peer_closed(int fd);

}  // namespace afd::serve
