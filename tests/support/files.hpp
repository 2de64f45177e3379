// Reading what a run wrote: a JSON Lines log as records, a file as its bytes, a checkpoint
// directory's tensor files. A missing file is an error, never an empty value that would compare
// equal to another missing one.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::testing {

// A fresh directory under the system's temporary directory, removed with everything in it.
class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& stem = "tandem-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<nlohmann::json> read_log(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream input(path);
  if (!input) throw std::runtime_error("read_log: cannot open " + path.string());
  std::string line;
  while (std::getline(input, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

inline std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream input(path, std::ios::binary);
  if (!input) throw std::runtime_error("bytes_of: cannot open " + path.string());
  std::ostringstream out;
  out << input.rdbuf();
  return out.str();
}

// Every *.safetensors file of a checkpoint directory by name, with its bytes: the whole-state
// files of one rank or the shards of several. Throws when there is none.
inline std::map<std::string, std::string> tensor_files_of(const std::filesystem::path& directory) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.path().extension() == ".safetensors") files[entry.path().filename().string()] = bytes_of(entry.path());
  }
  if (files.empty()) throw std::runtime_error("tensor_files_of: no .safetensors file in " + directory.string());
  return files;
}

}  // namespace tandem::testing
