// What the tensor- and pipeline-parallel trainer tests share (tests/production_tensor_parallel_test.cpp,
// production_pipeline_parallel_test.cpp): the optimizer and schedule both runs train with, a
// layout's ranks on threads of this process over the tiny production samples, the bitwise state
// comparison, and the harness's comparison of a layout's production twin with the double reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/main_state.hpp"
#include "core/model_layout.hpp"
#include "equivalence/comparison.hpp"
#include "equivalence/twin.hpp"
#include "production/checkpointing.hpp"
#include "production/local_ranks.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace tandem::testing {

inline production::ProductionOptions cpu_options() {
  production::ProductionOptions options;
  options.device = production::Device::cpu;
  return options;
}

// The optimizer and schedule the tensor- and pipeline-parallel runs share: clipping at 0.5, warmup
// from lr 1e-4 over 4 samples into cosine decay from 1e-3, and a constant weight decay of 0.1.
inline void set_clipped_cosine_schedule(RunConfig& config) {
  config.optimizer.adam_beta2 = 0.95;
  config.optimizer.clip_grad = 0.5;
  config.schedule.lr = 1e-3;
  config.schedule.lr_warmup_init = 1e-4;
  config.schedule.lr_warmup_samples = 4;
  config.schedule.lr_decay_style = LrDecayStyle::cosine;
  config.schedule.weight_decay = 0.1;
  config.schedule.start_weight_decay = 0.1;
  config.schedule.end_weight_decay = 0.1;
  config.schedule.wd_incr_samples = 32;
}

// config.parallel's TP x PP x DP ranks on threads, the cpu backend.
struct Ranks {
  explicit Ranks(const RunConfig& config, const production::ProductionOptions& options = cpu_options())
      : ranks(config, tiny_production_samples(), options, production::LocalRanks::Transport::threads) {}
  std::vector<IterationRecord> run() {
    std::vector<IterationRecord> records(ranks.size());
    ranks.each([&](production::Trainer& trainer, int rank) {
      records[static_cast<std::size_t>(rank)] = trainer.run_iteration();
    });
    return records;
  }
  production::HostState state() {
    std::vector<production::HostState> states(ranks.size());
    ranks.each([&](production::Trainer& trainer, int rank) { states[static_cast<std::size_t>(rank)] = trainer.host_state(); });
    return states.front();
  }
  // Every rank writes its part of one checkpoint into `directory`.
  void save_to(const std::filesystem::path& directory) {
    ranks.each([&](production::Trainer& trainer, int) { production::save_trainer_checkpoint(trainer, directory); });
  }
  // Every rank takes up its part of the checkpoint in `directory`.
  void resume_from(const std::filesystem::path& directory) {
    ranks.each([&](production::Trainer& trainer, int) { production::resume_trainer_from(trainer, directory); });
  }
  production::LocalRanks ranks;
};

// Exact: every element of the main state and the counters.
inline void expect_same_state(const production::HostState& a, const production::HostState& b, const std::string& what) {
  EXPECT_EQ(a.params, b.params) << what;
  EXPECT_EQ(a.exp_avg, b.exp_avg) << what;
  EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq) << what;
  EXPECT_EQ(a.counters, b.counters) << what;
}

// What a save in the middle of a run left: the ranks' state at the save, and the checkpoint read
// whole, as the export and `tandem check --load` read it (load_checkpoint assembles the shards'
// whole-model ranges).
struct SavedMidRun {
  production::HostState at_save;
  MainState<double> whole;
};

// SPEC 9 on config's layout, deterministic (bitwise): 2 updates, a save into `directory`, fresh
// ranks resumed from it and 2 more updates equal 4 updates straight, and the resumed ranks start
// from the saved state. `layout` names the layout in the messages.
inline SavedMidRun expect_resume_equals_straight(const RunConfig& config, const std::filesystem::path& directory,
                                                 const std::string& layout) {
  Ranks straight(config);
  for (int i = 0; i < 4; ++i) straight.run();
  Ranks stopped(config);
  for (int i = 0; i < 2; ++i) stopped.run();
  SavedMidRun saved;
  saved.at_save = stopped.state();
  stopped.save_to(directory);
  saved.whole = checkpoint::read_main_state_widened(
      make_model_layout(config.model), checkpoint::load_checkpoint(checkpoint::resolve_checkpoint_directory(directory)));
  Ranks resumed(config);
  resumed.resume_from(directory);
  expect_same_state(resumed.state(), saved.at_save, layout + " resumed");
  for (int i = 0; i < 2; ++i) resumed.run();
  expect_same_state(resumed.state(), straight.state(), layout + ": 2 + resume + 2 vs 4 straight");
  return saved;
}

// The harness's own comparison: `updates` teacher-forced updates of `kind` (the production twin
// on config's layout) against the double reference on one replica without model parallelism
// (SPEC 13), from the same state; held to the harness's bounds (harness_pair).
inline equivalence::Report compare_with_the_reference(
    const RunConfig& config, std::int64_t updates,
    const equivalence::TwinKind& kind = equivalence::production_twin(false)) {
  using namespace equivalence;
  RunConfig reference_config = config;
  reference_config.parallel.tensor_parallel = 1;
  reference_config.parallel.pipeline_parallel = 1;
  reference_config.parallel.virtual_pipeline_stages = 1;
  reference_config.parallel.first_pipeline_stage_layers = 0;
  reference_config.parallel.last_pipeline_stage_layers = 0;
  reference_config.parallel.sequence_parallel = false;
  reference_config.parallel.data_parallel = 1;
  reference_config.parallel.world_size = 1;
  const StreamSamples stream = tiny_production_samples();
  const reference::SampleProvider samples = [stream](std::int64_t index) { return stream(index); };
  TwinSetup reference_setup;
  reference_setup.config = reference_config;
  reference_setup.samples = samples;
  TwinSetup test_setup = reference_setup;
  test_setup.config = config;
  auto reference = reference_twin().make(reference_setup);
  auto under_test = kind.make(test_setup);
  const PrecisionPair precisions = harness_pair(precision_of(kind, config), fp64());
  Report report;
  compare_states_bitwise(0, "initial ", reference->state(), under_test->state(), report);
  run_teacher_forced(*reference, *under_test, updates, reference_config, precisions, report);
  return report;
}

// A fresh directory under the system's temporary one, named for the test and this process.
inline std::filesystem::path scratch_directory(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / ("tandem-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(path);
  return path;
}

}  // namespace tandem::testing
