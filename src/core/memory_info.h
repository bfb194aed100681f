// What this machine can still give: for refusing, with a clear error, work that would
// otherwise be killed by the kernel's out-of-memory handler part-way through.
#pragma once

#include <cstdint>

namespace afd {

// MemAvailable of /proc/meminfo in bytes (memory the kernel can hand out without swapping),
// or -1 where it cannot be read (not Linux, no /proc).
int64_t available_memory_bytes();

}  // namespace afd
