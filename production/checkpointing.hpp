// The production trainer's state <-> a tandem checkpoint (SPEC 9): fp32 main weights and Adam
// moments, the counters, the scheduler and the configuration. The bf16 compute copy is not
// stored: it is rewritten from the main weights on load.
//
// On one rank the checkpoint is format 1 (core/checkpoint/checkpoint.hpp: F32 tensors under the
// Hugging Face names, "exp_avg." and "exp_avg_sq." for the moments). With DP > 1 each rank writes
// its own pieces of the flat state (format 3, core/checkpoint/sharded.hpp), so no rank gathers the
// whole state; a resume reads, on each rank, only the ranges it keeps, from any format (1, 2, 3)
// and whatever data-parallel size wrote it.
#pragma once

#include <filesystem>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/resume_check.hpp"
#include "production/arithmetic.hpp"
#include "production/trainer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// The whole checkpoint of `trainer` as it stands (downloads the main state; gathers it from the
// shards with the distributed optimizer: every rank calls it).
checkpoint::CheckpointState make_checkpoint_state(const Trainer& trainer);

// Restores weights, moments and counters. Throws std::runtime_error naming the tensor on a
// missing tensor or a shape mismatch, or when another engine wrote the checkpoint, and (unless
// --override-opt-param-scheduler) a ConfigError listing every changed optimizer/schedule setting.
void restore_checkpoint_state(Trainer& trainer, const checkpoint::CheckpointState& state);

// Collective: saves the trainer under `save_dir` (format 1 with one rank, else format 3, each rank
// its pieces) and returns the iteration directory. On a failure every rank throws.
std::filesystem::path save_trainer_checkpoint(const Trainer& trainer, const std::filesystem::path& save_dir,
                                              const checkpoint::SaveHooks& hooks = {});

// Restores the trainer from `load_dir` (a --save directory or an iter_ directory; any format),
// each rank reading and verifying only the files that hold its ranges, each once. Errors as
// restore_checkpoint_state, and naming the file on corruption. Returns the setting changes the
// resume allowed (core/checkpoint/resume_check.hpp), for the run to report.
std::vector<checkpoint::SettingChange> resume_trainer_from(Trainer& trainer, const std::filesystem::path& load_dir);

}  // namespace tandem::production
