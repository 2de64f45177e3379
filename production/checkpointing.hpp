// The production trainer's state <-> a tandem checkpoint (SPEC 9): fp32 main weights and Adam
// moments as F32 tensors under the reference's names (Hugging Face names; "exp_avg." and
// "exp_avg_sq." prefixes for the moments), the counters, the scheduler and the configuration.
// The bf16 compute copy is not stored: it is rewritten from the main weights on load.
#pragma once

#include "core/checkpoint/checkpoint.hpp"
#include "production/trainer.hpp"

namespace tandem::production {

// The checkpoint of `trainer` as it stands (downloads the main state).
checkpoint::CheckpointState make_checkpoint_state(const Trainer& trainer);

// Restores weights, moments and counters. Throws std::runtime_error naming the tensor on a
// missing tensor or a shape mismatch, or when another engine wrote the checkpoint, and (unless
// --override-opt-param-scheduler) a ConfigError listing every changed optimizer/schedule setting.
void restore_checkpoint_state(Trainer& trainer, const checkpoint::CheckpointState& state);

}  // namespace tandem::production
