// The run's layout: where each rank sits in Megatron's grid and which decoder layers each pipeline
// rank holds. Derived once from a validated configuration and passed to whoever needs it (the
// planner, `tandem plan --rank`, the launcher's groups, every rank's trainer): no component
// rebuilds it from the configuration's sizes on its own, and ranks on threads share one copy.
#pragma once

#include "core/config.hpp"
#include "core/pipeline_layout.hpp"
#include "core/rank_grid.hpp"

namespace tandem {

struct RunLayout {
  // Throws as RankGrid and PipelineStages do on sizes build_run_config would have refused.
  explicit RunLayout(const RunConfig& config);

  RankGrid grid;          // TP x CP x DP x PP: each rank's coordinates and groups
  PipelineStages stages;  // Megatron's decoder layers per pipeline rank and model chunk
};

}  // namespace tandem
