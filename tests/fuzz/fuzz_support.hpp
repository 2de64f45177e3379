// What the libFuzzer targets of tests/fuzz share: a scratch directory of this process for the
// readers that take a path, writing an input there, and silencing the error messages a rejected
// input prints (libFuzzer's own output and the sanitizers' reports go to the file descriptors, not
// through std::cerr, so a finding still shows).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>
#include <stdexcept>
#include <streambuf>
#include <string>

namespace tandem::fuzz {

// The folder this fuzzer process writes its inputs into, made once and removed at exit.
inline const std::filesystem::path& scratch_directory() {
  static const std::filesystem::path path = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "tandem-fuzz-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("tandem fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_directory(), ignored);
    });
    return std::filesystem::path(pattern);
  }();
  return path;
}

// Writes `bytes` to `path`, replacing it. A failure here is the harness's, not the reader's: abort.
inline void write_file(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "tandem fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Sends what the code under test prints on std::cout and std::cerr (usage, warnings, the messages
// of refused inputs) nowhere, so a run of millions of inputs does not flood the terminal.
inline void silence_standard_streams() {
  struct NullBuffer : std::streambuf {
    int overflow(int c) override { return c == EOF ? 0 : c; }
  };
  static NullBuffer null_buffer;
  std::cout.rdbuf(&null_buffer);
  std::cerr.rdbuf(&null_buffer);
}

}  // namespace tandem::fuzz
