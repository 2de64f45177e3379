// `tandem plan [ARGS] [--json]`: the planner (core/planner.hpp) on the command line. Takes the same
// run options as `tandem train` and prints the plan as a table, or as one JSON object (SPEC 11, 12);
// `--rank R` adds where rank R sits in the rank grid.
#include <iostream>
#include <memory>
#include <ostream>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/args.hpp"
#include "core/planner.hpp"
#include "core/pipeline_layout.hpp"
#include "core/rank_grid.hpp"
#include "core/run_layout.hpp"

namespace tandem::cli {
namespace {

// Everything the subcommand binds; owned by the run function so the bound pointers stay valid.
struct PlanCommandState {
  RunArguments run;
  PlanOptions plan;
  bool json = false;
  std::int64_t rank = -1;  // --rank: -1 = none
};

// `--rank R`: where global rank R sits in the run's rank grid (core/rank_grid.hpp) and the members
// of each of its groups, so a user can see where GPU 4,097 of the seed's 5,120 sits.
nlohmann::json rank_json(const RankGrid& grid, const PipelineStages& stages, std::int64_t rank) {
  const RankCoordinates at = grid.coordinates(rank);
  nlohmann::json chunks = nlohmann::json::array();
  for (std::int64_t chunk = 0; chunk < stages.virtual_stages(); ++chunk) {
    const LayerRange layers = stages.layers(at.pipeline, chunk);
    chunks.push_back({{"chunk", chunk}, {"first_layer", layers.begin}, {"layers", layers.size()},
                      {"embedding", PipelineStages::holds_embedding(at.pipeline, chunk)},
                      {"output_and_loss", stages.holds_output(at.pipeline, chunk)}});
  }
  nlohmann::json out = {{"rank", rank},
                        {"grid", grid.describe()},
                        {"coordinates", {{"tensor", at.tensor}, {"context", at.context}, {"data", at.data},
                                         {"pipeline", at.pipeline}}},
                        {"model_chunks", chunks}};
  for (const RankGroupKind kind : kRankGroupKinds) {
    out["groups"][to_string(kind)] = {{"index", grid.group_index(kind, rank)},
                                      {"rank_in_group", grid.rank_in_group(kind, rank)},
                                      {"members", grid.members(kind, rank)}};
  }
  return out;
}

void print_rank(std::ostream& out, const RankGrid& grid, const PipelineStages& stages, std::int64_t rank) {
  const RankCoordinates at = grid.coordinates(rank);
  const bool first = PipelineStages::holds_embedding(at.pipeline, 0);
  const bool last = stages.holds_output(at.pipeline, stages.virtual_stages() - 1);
  out << "\nRank " << rank << " of " << grid.describe() << "\n"
      << "  coordinates: tensor " << at.tensor << ", context " << at.context << ", data " << at.data
      << ", pipeline stage " << at.pipeline << "\n"
      << "  holds: " << (first ? "the embedding, " : "") << stages.describe(at.pipeline)
      << (stages.virtual_stages() > 1 ? " (" + std::to_string(stages.virtual_stages()) + " model chunks)" : "")
      << (last ? ", the final norm, output layer and loss" : "") << "\n";
  for (const RankGroupKind kind : kRankGroupKinds) {
    const auto members = grid.members(kind, rank);
    out << "  " << to_string(kind) << " group";
    if (members.empty()) {
      out << ": none (a middle pipeline stage holds no embedding)\n";
      continue;
    }
    out << " " << grid.group_index(kind, rank) << " of " << grid.group_count(kind) << ", member "
        << grid.rank_in_group(kind, rank) << ": " << describe_ranks(members) << "\n";
  }
}

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
      ->check(positive_number())
      ->group(group);
  sub->add_option("--rank", state->rank,
                  "also print where this global rank sits in Megatron's rank grid (TP fastest, then CP, "
                  "DP, PP) and the members of each of its groups (default: none)")
      ->group(group);

  Command command;
  command.app = sub;
  command.run = [state]() {
    const RunConfig config = build_run_config(state->run);  // ConfigError -> exit 2 in main
    const PlanOptions options = state->plan;
    const RunLayout layout(config);
    const RankGrid& grid = layout.grid;
    if (state->rank != -1 && (state->rank < 0 || state->rank >= grid.world_size())) {
      throw ConfigError({ConfigIssue{"--rank", std::to_string(state->rank),
                                     "must be a rank of the run's " + std::to_string(grid.world_size()) + " (" +
                                         grid.describe() + ")",
                                     "give a rank in [0, " + std::to_string(grid.world_size()) + ")"}});
    }
    const Plan plan = make_plan(config, layout, options);
    if (state->json) {
      nlohmann::json out;
      to_json(out, plan);
      if (state->rank >= 0) out["rank"] = rank_json(grid, layout.stages, state->rank);
      std::cout << out.dump(2) << "\n";
    } else {
      print_plan(std::cout, plan);
      if (state->rank >= 0) print_rank(std::cout, grid, layout.stages, state->rank);
    }
    return 0;
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(10, add_plan_command);

}  // namespace tandem::cli
