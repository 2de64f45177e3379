// The benchmarks' runs, configured as `tandem train` configures one: its options parsed by the CLI's
// own parser and checked by the same rules, for a single process.
#pragma once

#include <string>
#include <vector>

#include "core/args.hpp"

namespace tandem::bench {

// `arguments` as `tandem train` takes them (a later value of an option wins); throws
// CLI::ParseError or ConfigError as the command would report them.
inline RunConfig run_config_from_options(const std::vector<std::string>& arguments, const std::string& program) {
  CLI::App app(program);
  RunArguments run;
  add_run_options(app, run);
  std::vector<std::string> reversed(arguments.rbegin(), arguments.rend());  // CLI11 pops from the back
  app.parse(reversed);
  LaunchContext launch;
  launch.launched_world_size = 1;
  return build_run_config(run, launch);
}

}  // namespace tandem::bench
