// Logging goes through spdlog; this header fixes the project's logger setup.
#pragma once

#include <spdlog/spdlog.h>

namespace afd {

// Sends all logging to stderr (stdout carries command output such as generated ids).
void init_logging();
// Sets the global level from a name ("trace".."off"); unknown names leave it unchanged.
void set_log_level(const char* name);

}  // namespace afd
