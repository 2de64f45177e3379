// The shared header record and progress line (run_support.hpp).
#include "core/train/run_support.hpp"

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/resume_check.hpp"
#include "core/config_issue.hpp"
#include "core/train/exit_signal.hpp"

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

namespace tandem {

nlohmann::json header_record(const HeaderIdentity& identity, const RunConfig& config,
                             const ModelLayout& layout, const nlohmann::json& data,
                             std::int64_t resumed_iteration, const nlohmann::json& extra) {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& tensor : layout.tensors) {
    groups.push_back({{"name", tensor.name},
                      {"shape", tensor.shape},
                      {"numel", tensor.numel},
                      {"group", to_string(tensor.decay_group)}});
  }
  nlohmann::json header = {
      {"type", "header"},
      {"engine", identity.engine},
      {"device", identity.device},
      {"main_precision", identity.main_precision},
      {"compute_precision", identity.compute_precision},
      {"config", config},
      {"data", data},
      {"parameter_groups",
       {{"decay", {{"elements", layout.elements_in(DecayGroup::decay)},
                   {"weight_decay", config.schedule.weight_decay}}},
        {"no_decay", {{"elements", layout.elements_in(DecayGroup::no_decay)}, {"weight_decay", 0.0}}}}},
      {"tensors", groups},
      {"total_parameters", layout.total_elements},
      {"resumed_from_iteration", resumed_iteration},
      {"build", {{"tandem_version", "0.1.0"}, {"compiler", __VERSION__}}},
  };
  if (!identity.device_description.empty()) header["device_description"] = identity.device_description;
  for (const auto& [key, value] : extra.items()) header[key] = value;
  return header;
}

std::string progress_line(const IterationRecord& record, std::int64_t total_iterations) {
  std::ostringstream line;
  line << "iter " << record.iteration << "/" << total_iterations << " | loss "
       << std::fixed << std::setprecision(4) << record.loss << " | lr " << std::scientific
       << std::setprecision(3) << record.lr << " | grad norm " << record.grad_norm;
  if (record.clipped) line << " (clipped x" << std::fixed << std::setprecision(4) << record.clip_coeff << ")";
  if (!record.update_successful) line << " | SKIPPED (non-finite)";
  line << " | loss tokens " << record.loss_tokens << " | " << std::fixed << std::setprecision(0)
       << record.tokens_per_second << " tok/s";
  if (record.mfu) line << " | MFU " << std::setprecision(1) << 100.0 * *record.mfu << "%";
  return line.str();
}

std::string evaluation_line(const EvaluationRecord& record) {
  std::ostringstream line;
  line << "validation loss at iteration " << record.iteration
       << (record.at_end ? " on validation set" : "") << " | lm loss value: " << std::uppercase
       << std::scientific << std::setprecision(6) << record.loss << " | lm loss PPL: " << record.ppl
       << " | " << record.samples << " samples, " << record.loss_tokens << " loss tokens";
  return line.str();
}

std::string evaluation_summary(const RunConfig& config) {
  const EvaluationConfig& evaluation = config.evaluation;
  if (!evaluation.evaluates()) return "";
  std::ostringstream line;
  line << "evaluation: " << evaluation.eval_iters << " global batches ("
       << evaluation.eval_iters * config.batch.global_batch_size
       << " samples) of the validation split (--split " << config.data.split << ") ";
  if (evaluation.eval_interval > 0) {
    line << "every " << evaluation.eval_interval << " iterations and ";
  }
  line << "at the end of training\n";
  return line.str();
}

std::vector<std::string> describe_resume_changes(const std::vector<checkpoint::SettingChange>& changes) {
  std::vector<std::string> out;
  for (const auto& change : changes) out.push_back(checkpoint::describe(change));
  return out;
}

nlohmann::json resume_header_fields(const RunConfig& config, const std::vector<std::string>& changes) {
  if (config.checkpoint.load.empty()) return nlohmann::json::object();
  return {{"resume_changes", changes}};
}

std::string resolve_log_path(const RunConfig& config, const TrainOptions& options) {
  if (!options.log_path.empty() || config.checkpoint.save.empty()) return options.log_path;
  std::filesystem::create_directories(config.checkpoint.save);
  return (std::filesystem::path(config.checkpoint.save) / "log.jsonl").string();
}

namespace {

// Why the run stops after this iteration ("" = it goes on): a stop signal on any rank, or the duration
// passed on any rank. One exchange per iteration, and only when either option is on.
std::string early_exit_reason(const TrainOptions& options, const IterationDriver& driver) {
  if (!options.exit_signal_handler && options.exit_duration_minutes <= 0) return "";
  auto any_rank = [&driver](bool flag) { return driver.any_rank ? driver.any_rank(flag) : flag; };
  const bool signalled = any_rank(options.exit_signal_handler && exit_signal_received());
  const double minutes =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - options.start).count() / 60.0;
  const bool expired = any_rank(options.exit_duration_minutes > 0 && minutes > options.exit_duration_minutes);
  if (signalled) {
    const std::string here = options.exit_signal_handler ? exit_signal_name() : "";
    return here.empty() ? "a stop signal (SIGTERM, SIGINT or SIGUSR1) reached another rank (--exit-signal-handler)"
                        : here + " received (--exit-signal-handler)";
  }
  if (expired) {
    std::ostringstream reason;
    reason << std::fixed << std::setprecision(2) << minutes << " minutes passed (--exit-duration-in-mins "
           << std::defaultfloat << options.exit_duration_minutes << ")";
    return reason.str();
  }
  return "";
}

}  // namespace

RunSummary drive_iterations(const RunConfig& config, const TrainOptions& options,
                            std::int64_t resumed_iteration, const IterationDriver& driver,
                            JsonlLog& log, std::ostream& out) {
  const std::int64_t total_iterations = config.train_updates();
  const bool saving = static_cast<bool>(driver.save);
  RunSummary summary;
  const bool evaluating = static_cast<bool>(driver.evaluate);
  auto evaluate = [&](bool at_end) {
    EvaluationRecord record = driver.evaluate();
    record.at_end = at_end;
    if (log.is_open()) log.write(record);
    out << evaluation_line(record) << "\n" << std::flush;  // printed even with --quiet, as Megatron
  };
  if (total_iterations == 0 && saving && resumed_iteration == 0) driver.save();  // SPEC 12
  bool stopped_early = false;
  while (driver.counters().iteration < total_iterations) {
    const IterationRecord record = driver.run_iteration();
    if (summary.iterations == 0) summary.first_loss = record.loss;
    summary.last_loss = record.loss;
    ++summary.iterations;
    if (log.is_open()) log.write(record);
    if (!options.quiet) out << progress_line(record, total_iterations) << "\n" << std::flush;
    if (driver.after_iteration) driver.after_iteration();
    const Counters counters = driver.counters();
    if (counters.consecutive_skips >= options.max_consecutive_skips) {
      if (saving) driver.save();
      throw std::runtime_error(
          "iteration " + std::to_string(record.iteration) + ": " +
          std::to_string(counters.consecutive_skips) +
          " consecutive skipped updates (non-finite loss or gradient norm) reached "
          "--max-consecutive-skips " + std::to_string(options.max_consecutive_skips) +
          "; fix: inspect the batch and the learning rate, then resume from the last checkpoint");
    }
    // Megatron: the evaluation of an interval iteration runs before that iteration's checkpoint.
    if (evaluating && config.evaluation.eval_interval > 0 &&
        counters.iteration % config.evaluation.eval_interval == 0) {
      evaluate(false);
    }
    const bool interval_due = config.checkpoint.save_interval > 0 &&
                              counters.iteration % config.checkpoint.save_interval == 0;
    const bool exit_due =
        options.exit_interval > 0 && counters.iteration % options.exit_interval == 0;
    const std::string early_exit = early_exit_reason(options, driver);
    if (saving && (interval_due || exit_due || !early_exit.empty() || counters.iteration == total_iterations)) {
      driver.save();
    }
    if (exit_due) {
      out << "exiting at iteration " << counters.iteration << " (--exit-interval "
          << options.exit_interval << ")\n";
      stopped_early = true;
      break;
    }
    if (!early_exit.empty()) {
      out << "exiting at iteration " << counters.iteration << ": " << early_exit
          << (saving ? "; checkpoint saved" : "; no --save, so nothing was saved") << "\n";
      stopped_early = true;
      break;
    }
  }
  // Megatron evaluates once more after training (its final checkpoint is already written).
  if (evaluating && !stopped_early) evaluate(true);
  summary.skipped_updates = driver.counters().skipped_updates;
  return summary;
}

bool resumes_from_load(const RunConfig& config, std::ostream& out) {
  if (config.checkpoint.load.empty()) return false;
  if (checkpoint::holds_checkpoint(config.checkpoint.load)) return true;
  out << "warning: --load " << config.checkpoint.load << " holds no checkpoint (no "
      << checkpoint::kTrackerFileName << " or " << checkpoint::kManifestFileName
      << "): starting from the initialization, as Megatron does\n";
  return false;
}

void require_save_not_ahead(const RunConfig& config, std::int64_t start_iteration) {
  if (config.checkpoint.save.empty()) return;
  std::optional<std::int64_t> saved;
  try {
    saved = checkpoint::read_latest_iteration(config.checkpoint.save);
  } catch (const std::exception&) {
    return;  // an unreadable tracker is the save's own error to report, not this check's
  }
  if (!saved || *saved <= start_iteration) return;
  const std::string save = config.checkpoint.save;
  throw ConfigError({ConfigIssue{
      "--save", save,
      "already holds a run's checkpoints up to iteration " + std::to_string(*saved) + ", and this run starts at " +
          (start_iteration == 0 ? std::string("the initialization") : "iteration " + std::to_string(start_iteration)) +
          ": it would truncate that run's log and move its tracker back",
      "resume it with --load " + save + ", or give this run a --save directory of its own"}});
}

}  // namespace tandem
