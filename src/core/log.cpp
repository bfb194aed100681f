#include "core/log.h"

namespace afd {

void set_log_level(const char* name) {
  auto lvl = spdlog::level::from_str(name);
  if (lvl != spdlog::level::off || std::string_view(name) == "off") spdlog::set_level(lvl);
}

}  // namespace afd
