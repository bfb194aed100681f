// Logging goes through spdlog; this header fixes the project's logger setup.
#pragma once

#include <spdlog/spdlog.h>

namespace afd {

// Sets the global level from a name ("trace".."off"); unknown names leave it unchanged.
void set_log_level(const char* name);

}  // namespace afd
