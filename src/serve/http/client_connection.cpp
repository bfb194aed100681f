#include "serve/http/client_connection.h"

namespace afd::serve {

bool peer_closed(int fd) {
  http::Request probe;
  probe.socket = fd;
  return probe.client_gone();
}

}  // namespace afd::serve
