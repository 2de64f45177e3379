// What both twins' runs write the same way (SPEC 12): the log's header record and the progress
// line of an iteration. reference/run.cpp and production/run.cpp build their runs from these.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/resume_check.hpp"
#include "core/config.hpp"
#include "core/model_layout.hpp"
#include "core/train/records.hpp"
#include "core/train/train_options.hpp"

namespace tandem {

// Who wrote a log: the header's engine, device and precision fields.
struct HeaderIdentity {
  std::string engine;             // "reference" | "production"
  std::string device;             // "cpu" | "cuda"
  std::string device_description; // e.g. "NVIDIA H200 (sm_90, 139 GiB)"; empty: not written
  std::string main_precision;     // "double" | "float50" | "fp32" (what `tandem audit` reads)
  std::string compute_precision;  // "double" | "float50" | "fp32" | "bf16"
};

// The {"type":"header", ...} record: identity, the validated configuration, the data (as
// data::data_description writes it: the prefix or the blend, and the split), the
// parameter groups (SPEC 7), every tensor, the resume point and the build. `extra` members
// (an object) are added as they are.
nlohmann::json header_record(const HeaderIdentity& identity, const RunConfig& config,
                             const ModelLayout& layout, const nlohmann::json& data,
                             std::int64_t resumed_iteration,
                             const nlohmann::json& extra = nlohmann::json::object());

// "iter 3/10 | loss 5.1234 | lr 1.000e-03 | grad norm ... | 1234 tok/s" (plus MFU when known).
std::string progress_line(const IterationRecord& record, std::int64_t total_iterations);

// "validation loss at iteration 8 | lm loss value: 5.123456E+00 | lm loss PPL: 1.678551E+02 |
// 64 samples, 1984 loss tokens" (Megatron's line; "... at iteration 8 on validation set ..." for
// the evaluation at the end of training, as Megatron words its final one).
std::string evaluation_line(const EvaluationRecord& record);

// "evaluation: ..." (one line, ending in a newline) saying when the run evaluates its validation
// split and how much; "" for a run that does not evaluate (its console output is unchanged).
std::string evaluation_summary(const RunConfig& config);

// The settings a resume changed and the checkpoint allowed (a data setting, or an optimizer/
// schedule one under --override-opt-param-scheduler; what the engines' restores return from
// check_resume_settings), one line each, for the console and the log header.
std::vector<std::string> describe_resume_changes(const std::vector<checkpoint::SettingChange>& changes);
// {"resume_changes": [...]} for the log header of a resumed run; {} without --load (so a fresh
// run's header is unchanged).
nlohmann::json resume_header_fields(const RunConfig& config, const std::vector<std::string>& changes);

// --log, or SAVE/log.jsonl with --save (creating SAVE), or empty for no log (SPEC 12).
std::string resolve_log_path(const RunConfig& config, const TrainOptions& options);

// Whether the run resumes: --load is given and holds a checkpoint. When --load holds none (a job
// script's first run, with --load = --save), Megatron starts from the initialization with a
// warning, and so does tandem: the warning goes to `out`.
bool resumes_from_load(const RunConfig& config, std::ostream& out);

// Refuses (ConfigError, exit 2) a run that starts at `start_iteration` into a --save directory
// whose tracker is further on: it would truncate that run's log and move its tracker back (a
// restart that forgot --load). Both engines call it before they open the log.
void require_save_not_ahead(const RunConfig& config, std::int64_t start_iteration);

// What one invocation of a run did (the CLI prints it; tests read it).
struct RunSummary {
  std::int64_t iterations = 0;       // run by this invocation
  double first_loss = 0;             // of this invocation's first iteration
  double last_loss = 0;
  std::int64_t skipped_updates = 0;  // cumulative
};

// What the shared iteration loop drives: one engine's trainer.
struct IterationDriver {
  std::function<IterationRecord()> run_iteration;
  std::function<Counters()> counters;  // after the last iteration
  std::function<void()> save;          // writes a checkpoint; empty without --save
  // Collective: whether `flag` is true on any rank (every rank calls it together); empty: one
  // process. The loop's decisions to stop early must be the same on every rank.
  std::function<bool(bool flag)> any_rank;
  // One evaluation of the validation split (config.evaluation.eval_iters global batches from the
  // trainer's consumed_valid_samples); empty when the run does not evaluate. Collective.
  std::function<EvaluationRecord()> evaluate;
  // After each iteration's record is logged and printed: more records of that iteration (the
  // production trainer's pipeline timeline); empty: none.
  std::function<void()> after_iteration;
};

// The loop both engines run after setup: iterate to config.train_updates(), log each record,
// print progress, checkpoint every --save-interval, at --exit-interval and at the end, write the
// initialized model when there is nothing to train (SPEC 12), and stop with an error after
// --max-consecutive-skips skipped updates in a row, after a final checkpoint (SPEC 8). With
// --exit-signal-handler or --exit-duration-in-mins it stops, saving, after the iteration at which
// any rank received SIGTERM or passed the duration (Megatron's behaviour).
// With driver.evaluate (docs/DATA.md section 12, Megatron's order): after iteration k's record,
// when k % --eval-interval == 0, it evaluates, logs and prints, before k's checkpoint (which then
// holds the advanced consumed_valid_samples); and once more after the loop ends at the last
// iteration (after the final checkpoint, so that evaluation is not in it), even when the last
// iteration evaluated already. A run that stops early (--exit-interval, a signal, the duration,
// skipped updates) does not evaluate at the end, as Megatron exits before it does.
RunSummary drive_iterations(const RunConfig& config, const TrainOptions& options,
                            std::int64_t resumed_iteration, const IterationDriver& driver,
                            JsonlLog& log, std::ostream& out);

}  // namespace tandem
