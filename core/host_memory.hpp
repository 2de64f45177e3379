// What this machine's memory can still give: MemAvailable of /proc/meminfo, for refusing work
// that cannot fit before it allocates (production/run.cpp's memory check, tandem check's
// rounding probe).
#pragma once

#include <optional>

namespace tandem {

// Bytes available to new allocations now (MemAvailable), or nothing when the kernel does not say.
std::optional<double> host_available_bytes();

}  // namespace tandem
