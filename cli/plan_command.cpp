// `tandem plan [ARGS] [--json]`: the planner (core/planner.hpp) on the command line. Takes the same
// run options as `tandem train` and prints the plan as a table, or as one JSON object (SPEC 11, 12).
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/args.hpp"
#include "core/planner.hpp"

namespace tandem::cli {
namespace {

// Everything the subcommand binds; owned by the run function so the bound pointers stay valid.
struct PlanCommandState {
  RunArguments run;
  PlanOptions plan;
  std::string recompute = "none";
  bool json = false;
};

Command add_plan_command(CLI::App& parent) {
  auto state = std::make_shared<PlanCommandState>();
  CLI::App* sub = parent.add_subcommand(
      "plan", "Print the run's plan: batch and token arithmetic, pipeline bubble, schedule "
              "milestones, parameters and memory per GPU (SPEC 11)");
  add_run_options(*sub, state->run);
  const std::string group = "Plan";
  sub->add_flag("--json", state->json, "print one JSON object instead of the table (default: table)")
      ->group(group);
  sub->add_option("--gpu-memory-gib", state->plan.gpu_memory_gib,
                  "memory budget per GPU (GiB = 2^30 bytes; default: 80)")
      ->check(CLI::PositiveNumber)
      ->group(group);
  sub->add_option("--recompute-granularity", state->recompute,
                  "activation recomputation assumed for memory: none | selective | full "
                  "(default: none)")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->group(group);

  Command command;
  command.app = sub;
  command.run = [state]() {
    const RunConfig config = build_run_config(state->run);  // ConfigError -> exit 2 in main
    PlanOptions options = state->plan;
    options.recompute = *parse_recompute_granularity(state->recompute);  // IsMember checked it
    const Plan plan = make_plan(config, options);
    if (state->json) {
      nlohmann::json out;
      to_json(out, plan);
      std::cout << out.dump(2) << "\n";
    } else {
      print_plan(std::cout, plan);
    }
    return 0;
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(10, add_plan_command);

}  // namespace tandem::cli
