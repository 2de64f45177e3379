// `tandem`: the one binary. Parses the command line, runs the chosen subcommand, and turns
// failures into a clear message and a non-zero exit (2: bad input, 1: a failure while running).
#include <algorithm>
#include <iostream>

#include "cli/command.hpp"
#include "core/args.hpp"

namespace tandem::cli {

std::vector<RegisteredCommand>& command_registry() {
  static std::vector<RegisteredCommand> registry;
  return registry;
}

}  // namespace tandem::cli

int main(int argc, char** argv) {
  using namespace tandem;
  CLI::App app{
      "tandem: LLM pretraining with an exact reference twin.\n"
      "Every subcommand takes Megatron-LM's argument names; see `tandem SUBCOMMAND --help`.",
      "tandem"};
  app.require_subcommand(1);
  app.fallthrough(false);

  auto registry = cli::command_registry();
  std::stable_sort(registry.begin(), registry.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  std::vector<cli::Command> commands;
  for (const auto& entry : registry) commands.push_back(entry.factory(app));

  if (auto exit_code = parse_or_exit_code(app, argc, argv)) return *exit_code;
  for (auto& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run();
    } catch (const ConfigError& error) {
      std::cerr << error.what();
      return 2;
    } catch (const std::exception& error) {
      std::cerr << "error: " << error.what() << "\n";
      return 1;
    }
  }
  return 2;
}
