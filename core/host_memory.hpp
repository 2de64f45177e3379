// What this machine's memory can still give: MemAvailable of /proc/meminfo, for refusing work
// that cannot fit before it allocates (production/run.cpp's memory check, tandem check's
// rounding probe), and the words both refusals use for it.
#pragma once

#include <optional>
#include <string>

namespace tandem {

// Bytes available to new allocations now (MemAvailable), or nothing when the kernel does not say.
std::optional<double> host_available_bytes();

// One rank's share when `ranks_here` ranks of a job share this machine: host_available_bytes()
// split evenly (all of it for one rank), or nothing when the kernel does not say.
std::optional<double> host_share_bytes(int ranks_here);

// Bytes in GiB for a message: two decimals below 10 GiB, one above ("0.42", "114.5").
std::string gib_text(double bytes);

// "this machine has 3.20 GiB available for each of its 4 ranks" (no "for each ..." for one rank):
// how a refusal names the share it compared against.
std::string host_share_text(double share_bytes, int ranks_here);

}  // namespace tandem
