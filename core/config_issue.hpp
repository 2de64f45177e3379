// A broken configuration rule (ConfigIssue) and the error that carries every one of them
// (ConfigError, exit 2). Kept apart from core/args.hpp so that the code that checks a
// configuration (the data format, the checkpoint, the pipeline split) needs no CLI library.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace tandem {

// One broken rule: which field, what it held, the rule, and how to fix it.
struct ConfigIssue {
  std::string field;  // the argument, spelled as on the command line: "--global-batch-size"
  std::string value;  // what it held, as text
  std::string rule;   // the rule it breaks
  std::string fix;    // what to do instead
};

// Thrown by build_run_config with every broken rule at once.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<ConfigIssue> issues);
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

// "error: --field = value: rule; fix: fix" one per line.
std::string format_issues(const std::vector<ConfigIssue>& issues);

}  // namespace tandem
