// How a subcommand plugs into the `tandem` binary: each cli/*_command.cpp registers one factory
// that adds its CLI11 subcommand and returns what to run when it was chosen.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tandem::cli {

struct Command {
  CLI::App* app = nullptr;   // the subcommand, owned by the parent app
  std::function<int()> run;  // runs after parsing; returns the exit status
};

using CommandFactory = Command (*)(CLI::App& parent);

// Factories in registration order; `order` sorts the --help listing.
struct RegisteredCommand {
  int order;
  CommandFactory factory;
};
std::vector<RegisteredCommand>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(int order, CommandFactory factory) {
    command_registry().push_back({order, factory});
  }
};

}  // namespace tandem::cli

// TANDEM_COMMAND(10, add_plan_command): registers a factory defined in the same file.
#define TANDEM_COMMAND(order, factory) \
  static const ::tandem::cli::CommandRegistrar factory##_registrar{order, &factory}
