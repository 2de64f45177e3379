// Parses run options in-process exactly as every subcommand binds them (core/args.hpp), so tests
// can build a validated RunConfig from Megatron-style arguments.
#pragma once

#include <string>
#include <vector>

#include "core/args.hpp"

namespace tandem::testing {

// `arguments` without the program name; throws CLI::ParseError or ConfigError like the binary.
inline RunConfig parse_run(const std::vector<std::string>& arguments) {
  CLI::App app{"test", "tandem-test"};
  RunArguments args;
  add_run_options(app, args);
  std::vector<const char*> argv{"tandem-test"};
  for (const auto& argument : arguments) argv.push_back(argument.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return build_run_config(args);
}

// `arguments` followed by `extra` (a later repeated option wins, as in Megatron's argparse).
inline std::vector<std::string> with(std::vector<std::string> arguments,
                                     const std::vector<std::string>& extra) {
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  return arguments;
}

}  // namespace tandem::testing
