#include <cstdio>

#include "commands.h"
#include "core/cpu_features.h"

namespace afd::cli {

void register_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print version and detected CPU features");
  cmd->callback([] {
    std::printf("afd 0.1.0\ncpu: %s\n", cpu_features().to_string().c_str());
  });
}

}  // namespace afd::cli
