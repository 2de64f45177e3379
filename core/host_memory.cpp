#include "core/host_memory.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace tandem {

std::optional<double> host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kibibytes = 0;
    std::string unit;
    meminfo >> kibibytes >> unit;
    if (key == "MemAvailable:") return kibibytes * 1024.0;
  }
  return std::nullopt;
}

std::optional<double> host_share_bytes(int ranks_here) {
  const std::optional<double> available = host_available_bytes();
  if (!available) return std::nullopt;
  return *available / std::max(ranks_here, 1);
}

std::string gib_text(double bytes) {
  const double gib = bytes / (1024.0 * 1024.0 * 1024.0);
  std::ostringstream text;
  text << std::fixed << std::setprecision(gib < 10 ? 2 : 1) << gib;
  return text.str();
}

std::string host_share_text(double share_bytes, int ranks_here) {
  return "this machine has " + gib_text(share_bytes) + " GiB available" +
         (ranks_here > 1 ? " for each of its " + std::to_string(ranks_here) + " ranks" : "");
}

}  // namespace tandem
