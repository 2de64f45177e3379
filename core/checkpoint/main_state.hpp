// A trainer's main state (SPEC 9: main weights, Adam m and v in the engine's main precision, and
// the counters) <-> a checkpoint. Both twins use it: the reference with double (F64 tensors), the
// production trainer with float (F32). Tensors carry the model layout's Hugging Face names; the
// moments carry the prefixes "exp_avg." and "exp_avg_sq.".
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/resume_check.hpp"
#include "core/config.hpp"
#include "core/model_layout.hpp"
#include "core/train/main_state.hpp"

namespace tandem::checkpoint {

// The checkpoint of `state` (Scalar: double for the reference, float for production) written by `engine` under `config`.
template <class Scalar>
CheckpointState make_main_checkpoint(const std::string& engine, const RunConfig& config,
                                     const ModelLayout& layout, const MainState<Scalar>& state);

// make_main_checkpoint without the tensors: what a sharded save (sharded.hpp) records beside them.
template <class Scalar>
CheckpointState main_checkpoint_metadata(const std::string& engine, const RunConfig& config, const Counters& counters);

// Throws std::runtime_error when `saved` was written by another engine or precision than
// (engine, Scalar), and ConfigError for a setting the resumed run changed (check_resume_settings).
// Returns the changes check_resume_settings allowed.
template <class Scalar>
std::vector<SettingChange> check_main_checkpoint(const std::string& engine, const RunConfig& resumed, const CheckpointState& saved);

// The main state stored in `saved` for a run resumed under `resumed`. Throws std::runtime_error
// when another engine or precision wrote it, or a tensor is missing or misshapen (naming it), and
// ConfigError for a changed setting (check_resume_settings).
template <class Scalar>
MainState<Scalar> read_main_checkpoint(const std::string& engine, const RunConfig& resumed,
                                       const ModelLayout& layout, const CheckpointState& saved);

// The main state in `saved` whatever engine and precision wrote it, widened exactly to double
// (`tandem check --load`). Throws std::runtime_error naming a missing or misshapen tensor.
MainState<double> read_main_state_widened(const ModelLayout& layout, const CheckpointState& saved);

}  // namespace tandem::checkpoint
