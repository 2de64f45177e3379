// ConfigError's message: every broken rule, one line each.
#include "core/config_issue.hpp"

#include <utility>

namespace tandem {

ConfigError::ConfigError(std::vector<ConfigIssue> issues)
    : std::runtime_error(format_issues(issues)), issues_(std::move(issues)) {}

std::string format_issues(const std::vector<ConfigIssue>& issues) {
  std::string out;
  for (const auto& issue : issues) {
    out += "error: " + issue.field + " = " + issue.value + ": " + issue.rule + "; fix: " +
           issue.fix + "\n";
  }
  return out;
}

}  // namespace tandem
