// Reading what a run wrote: a JSON Lines log as records, a file as its bytes.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::testing {

inline std::vector<nlohmann::json> read_log(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream input(path);
  std::string line;
  while (std::getline(input, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

inline std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream input(path, std::ios::binary);
  std::ostringstream out;
  out << input.rdbuf();
  return out.str();
}

}  // namespace tandem::testing
