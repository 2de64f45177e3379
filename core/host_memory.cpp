#include "core/host_memory.hpp"

#include <fstream>
#include <string>

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

}  // namespace tandem
