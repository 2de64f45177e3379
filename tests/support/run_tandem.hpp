// Runs the built `tandem` binary (TANDEM_BINARY) through /bin/sh and captures stdout, so tests can
// check the user-facing contract (SPEC 12) of the real program, not a copy of its code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace tandem::testing {

struct CommandResult {
  int exit_code = -1;   // the process's exit status; -1 if it did not exit normally
  std::string output;   // stdout (stderr too when the command line redirects it)
};

// One shell word, single-quoted.
inline std::string shell_quoted(const std::string& word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `command` through /bin/sh and captures its stdout (stderr too when the command redirects it).
inline CommandResult run_shell(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  std::size_t read = 0;
  while ((read = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), read);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// `prefix TANDEM_BINARY arguments... suffix`; prefix may set variables ("PATH=/x ") or launch
// ("mpirun -np 2 "), suffix may redirect ("2>&1").
inline CommandResult run_tandem(const std::vector<std::string>& arguments,
                                const std::string& prefix = "", const std::string& suffix = "") {
  std::string command = prefix + shell_quoted(TANDEM_BINARY);
  for (const auto& argument : arguments) command += " " + shell_quoted(argument);
  return run_shell(command + " " + suffix);
}

// `mpirun -np RANKS ` as a run_tandem prefix (root needs --allow-run-as-root; a 2-core CI machine
// needs --oversubscribe), or empty when Open MPI's mpirun is not on the PATH.
// In the sanitizer build, leak detection is off in the processes mpirun starts: Open MPI keeps
// memory until exit and unloads its plugins first, so LeakSanitizer reports stacks it cannot
// symbolize (or suppress). Address and undefined-behaviour checks stay on, and the same trainer
// code runs leak-checked as threads (tests/production_data_parallel_test.cpp).
inline std::string mpirun_prefix(int ranks) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) return "";
  std::string prefix = "ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" mpirun -np " + std::to_string(ranks) + " --oversubscribe ";
  if (::geteuid() == 0) prefix += "--allow-run-as-root ";
  return prefix;
}

}  // namespace tandem::testing
