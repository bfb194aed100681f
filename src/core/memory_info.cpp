#include "core/memory_info.h"

#include <cinttypes>
#include <cstdio>

namespace afd {

int64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %" SCNd64 " kB", &kib) == 1) break;
    kib = -1;
  }
  std::fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

}  // namespace afd
