// The reference trainer's state <-> a tandem checkpoint (SPEC 9): main weights and Adam moments
// as F64 tensors with Hugging Face names ("exp_avg." / "exp_avg_sq." prefixes for the moments),
// the counters, the scheduler and the run's configuration. Only the double reference
// checkpoints: a 50-digit state does not fit the format without rounding, so resuming it could
// not be bit-exact.
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/resume_check.hpp"
#include "core/config.hpp"
#include "reference/trainer.hpp"

namespace tandem::reference {

// The checkpoint of `trainer` as it stands.
checkpoint::CheckpointState make_checkpoint_state(const Trainer<double>& trainer);

// Restores weights, moments and counters of `trainer` from `state`. Throws std::runtime_error
// naming the tensor on a missing tensor or a shape mismatch, and (unless the run's
// --override-opt-param-scheduler) a ConfigError listing every changed optimizer/schedule setting.
// Returns the setting changes the resume allowed (core/checkpoint/resume_check.hpp).
std::vector<checkpoint::SettingChange> restore_checkpoint_state(Trainer<double>& trainer,
                                                                const checkpoint::CheckpointState& state);

}  // namespace tandem::reference
