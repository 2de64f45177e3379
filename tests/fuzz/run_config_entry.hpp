// The entry point the argument and --config fuzz targets share: what `tandem plan` does with a
// command line before it prints (cli/plan_command.cpp): CLI11's parse of every run option
// (core/args.hpp), build_run_config (derived defaults, every rule, the --config file), the plan
// (core/planner.hpp) and both of its printings. A ConfigError (exit 2 in the binary) is the clean
// refusal; a crash, a sanitizer report, a hang, a leak or any other exception is a finding.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/args.hpp"
#include "core/planner.hpp"

namespace tandem::fuzz {

// Runs `tandem plan WORDS...` up to its output; returns normally for a plan or a clean refusal.
inline void plan_from_words(const std::vector<std::string>& words) {
  CLI::App app{"tandem (fuzz target)", "tandem"};
  app.require_subcommand(1);
  CLI::App* plan_command = app.add_subcommand("plan", "the plan");
  RunArguments arguments;
  add_run_options(*plan_command, arguments);

  std::vector<const char*> argv = {"tandem", "plan"};
  for (const std::string& word : words) argv.push_back(word.c_str());
  if (parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data())) return;  // refused or --help
  try {
    const RunConfig config = build_run_config(arguments);
    const Plan plan = make_plan(config, PlanOptions{});
    nlohmann::json json;
    to_json(json, plan);
    std::ostringstream table;
    print_plan(table, plan);
    (void)json.dump();
  } catch (const ConfigError&) {
  }
}

}  // namespace tandem::fuzz
