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

// Whom signal_tandem_during_run sends SIGTERM to.
enum class SignalTarget { process, last_child };

// Starts `prefix TANDEM_BINARY arguments...` in the background (stdout and stderr into
// `output_file`), waits until `log` holds at least `iterations` iteration records (at most 60 s),
// sends SIG`signal` (TERM unless told) to the process it started, or to that process's last child
// (one rank, when the prefix is mpirun), and waits for it. Returns the exit code of what it started.
inline int signal_tandem_during_run(const std::vector<std::string>& arguments, const std::string& prefix,
                                    const std::string& output_file, const std::string& log, int iterations,
                                    SignalTarget target, const std::string& signal = "TERM") {
  std::string command = prefix + shell_quoted(TANDEM_BINARY);
  for (const auto& argument : arguments) command += " " + shell_quoted(argument);
  const std::string find_child =
      "for s in /proc/[0-9]*/stat; do set -- $(cat $s 2>/dev/null); [ \"$4\" = \"$started\" ] && to=$1; done\n";
  const CommandResult result = run_shell(
      command + " > " + shell_quoted(output_file) + " 2>&1 &\n"
      "started=$!\n"
      "i=0; while [ $i -lt 1200 ]; do n=$(grep -c '\"type\":\"iteration\"' " + shell_quoted(log) + " 2>/dev/null);"
      " [ \"${n:-0}\" -ge " + std::to_string(iterations) + " ] && break; sleep 0.05; i=$((i+1)); done\n"
      "to=$started\n" + (target == SignalTarget::last_child ? find_child : std::string()) +
      "kill -" + signal + " $to\n"
      "wait $started; echo $?\n");
  return result.output.empty() ? -1 : std::stoi(result.output);
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
