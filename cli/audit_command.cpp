// `tandem audit LOG.jsonl`: recompute every audited AdamW update of a log in 50 digits and compare
// against the bound for the log's precision; the exit status is the verdict (SPEC 12).
#include <iomanip>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "reference/audit.hpp"

namespace tandem::cli {
namespace {

struct AuditCommandState {
  std::string log_path;
  bool verbose = false;
};

Command add_audit_command(CLI::App& parent) {
  auto state = std::make_shared<AuditCommandState>();
  CLI::App* sub = parent.add_subcommand(
      "audit", "Recompute the audited AdamW updates of a training log (--audit-params) in 50 "
               "digits; exit 1 when any differs beyond its bound");
  sub->add_option("log", state->log_path, "the run's JSON Lines log")->required();
  sub->add_flag("--verbose", state->verbose, "print every comparison, not just the worst");

  Command command;
  command.app = sub;
  command.run = [state]() {
    const auto report = reference::audit_log(state->log_path);
    for (const std::string& warning : report.warnings) std::cerr << "warning: " << warning << "\n";
    std::cout << "audit of " << state->log_path << ": " << report.iterations << " iterations, "
              << report.entries << " audited updates, main precision " << report.precision
              << "\n";
    if (report.findings.empty()) {
      std::cerr << "error: the log carries no audit entries; fix: train with --audit-params N\n";
      return 1;
    }
    auto print = [](const reference::AuditFinding& f) {
      std::cout << std::setprecision(17) << "  iter " << f.iteration << " " << f.tensor << "["
                << f.element << "] " << f.quantity << ": logged " << f.logged << " recomputed "
                << f.recomputed << " error " << std::setprecision(3) << f.error << " bound "
                << f.bound << " (" << std::fixed << std::setprecision(1)
                << (f.bound > 0 ? 100.0 * f.error / f.bound : 0.0) << "% of bound)"
                << std::defaultfloat << (f.ok() ? "" : "  MISMATCH") << "\n";
    };
    std::size_t mismatches = 0;
    for (const auto& finding : report.findings) {
      if (!finding.ok()) ++mismatches;
      if (state->verbose || !finding.ok()) print(finding);
    }
    std::cout << "worst:\n";
    print(*report.worst());
    std::cout << (report.ok() ? "verdict: every audited update matches SPEC 7 within its bound\n"
                              : "verdict: MISMATCH in " + std::to_string(mismatches) +
                                    " comparisons\n");
    return report.ok() ? 0 : 1;
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(50, add_audit_command);

}  // namespace tandem::cli
