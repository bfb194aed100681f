#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace afd {

void init_logging() {
  auto logger = spdlog::stderr_color_mt("afd");
  spdlog::set_default_logger(logger);
}

void set_log_level(const char* name) {
  auto lvl = spdlog::level::from_str(name);
  if (lvl != spdlog::level::off || std::string_view(name) == "off") spdlog::set_level(lvl);
}

}  // namespace afd
