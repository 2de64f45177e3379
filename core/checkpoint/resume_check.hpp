// The settings a resumed run must share with the checkpoint it resumes (SPEC 9: "a changed
// schedule or optimizer setting on resume is an error unless explicitly overridden").
//
// Optimizer and schedule settings (lr, min_lr, lr_warmup_init, decay style, warmup and decay
// samples, betas, eps, the weight decay settings, clip_grad, global batch size, seq length) may
// change only with --override-opt-param-scheduler (Megatron's name). The model's shape (layers,
// widths, heads, groups, vocabulary, biases, tying) may never change: the stored tensors would
// not fit, and no flag makes them fit. The data settings (--data-path, --split, --data-order,
// --packing, --seed, --loss-normalization) may change freely, as in Megatron (a new blend
// mid-run), and are reported: the run prints and logs each change.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/config.hpp"

namespace tandem::checkpoint {

struct SettingChange {
  std::string argument;  // as on the command line: "--lr"
  std::string saved;     // the checkpoint's value, as JSON text ("<absent>" when not recorded)
  std::string resumed;   // this run's value, as JSON text
  bool overridable = false;  // true for optimizer/schedule settings, false for the model's shape
  bool reported = false;     // a data setting: allowed without the override, and reported
};

// "--data-path changed: the checkpoint's run had X, this run has Y" for the log and the console.
std::string describe(const SettingChange& change);

// Every compared setting whose value differs between the checkpoint's run_config (its manifest's
// to_json(RunConfig)) and the resumed run, in a fixed order. Empty when nothing changed.
std::vector<SettingChange> changed_resume_settings(const nlohmann::json& saved_run_config,
                                                   const RunConfig& resumed);

// Throws ConfigError (core/config_issue.hpp) naming every change that is not allowed: a model-shape change
// always, an optimizer/schedule change unless resumed.checkpoint.override_opt_param_scheduler.
// Returns the changes that were allowed (by the override, or data settings), for the run to log.
std::vector<SettingChange> check_resume_settings(const nlohmann::json& saved_run_config,
                                                 const RunConfig& resumed);

}  // namespace tandem::checkpoint
