// HTTP plumbing shared by the engine server (HttpServer) and the engine-less front end
// (Frontend): OpenAI-style error answers and the cpp-httplib error / exception handlers.
#pragma once

#include <cstddef>
#include <string>

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace afd::serve {

// Sets status and an OpenAI-style error body; 429 and 503 also get Retry-After.
void send_error(httplib::Response& res, int status, const std::string& msg, int retry_after_s);

// Routes without a handler (404), bodies over max_body_bytes (413) and other protocol errors
// get an OpenAI-style JSON body; an exception escaping a handler becomes a logged 500 (never
// an abort). `who` names the server in the log line.
void install_error_handlers(httplib::Server& s, size_t max_body_bytes, const std::string& who);

}  // namespace afd::serve
