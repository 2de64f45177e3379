// The reference run (run.hpp): data -> resume -> header -> iterations -> checkpoints.
#include "reference/run.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "core/data/jsonl_builder.hpp"
#include "core/data/packing.hpp"
#include "core/model_layout.hpp"
#include "core/train/audit_selection.hpp"
#include "core/train/records.hpp"
#include "core/train/run_support.hpp"
#include "reference/checkpointing.hpp"
#include "reference/trainer.hpp"

namespace tandem::reference {
namespace {

std::string default_cache_directory() {
  const char* tmp = std::getenv("TMPDIR");
  return (std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / "tandem-default-corpus").string();
}

template <class Real>
RunSummary train_loop(const RunConfig& config, const TrainOptions& options, std::ostream& out) {
  const auto samples = open_training_samples(config, options);
  TestSwitches switches;
  switches.nonfinite_gradient_iterations = options.test_nonfinite_gradient_iterations;
  Trainer<Real> trainer(config, samples, switches);

  std::int64_t resumed_iteration = 0;
  if (!config.checkpoint.load.empty()) {
    if constexpr (std::is_same_v<Real, double>) {
      const auto state = checkpoint::load_checkpoint(config.checkpoint.load);
      restore_checkpoint_state(trainer, state);
      resumed_iteration = trainer.state().counters.iteration;
      out << "resumed from " << config.checkpoint.load << " at iteration " << resumed_iteration
          << "\n";
    } else {
      throw std::runtime_error(
          "--load: only the double reference resumes bit-exactly; fix: drop "
          "--reference-precision float50 or --load");
    }
  }
  const bool saving = !config.checkpoint.save.empty();
  if (saving && !std::is_same_v<Real, double>) {
    throw std::runtime_error("--save: the float50 reference does not write checkpoints (they hold "
                             "doubles); fix: drop --save or use --reference-precision double");
  }
  auto save = [&]() {
    if constexpr (std::is_same_v<Real, double>) {
      const auto path = checkpoint::save_checkpoint(config.checkpoint.save,
                                                    make_checkpoint_state(trainer));
      out << "saved checkpoint " << path.string() << "\n";
    }
  };

  std::string log_path = options.log_path;
  if (log_path.empty() && saving) {
    std::filesystem::create_directories(config.checkpoint.save);
    log_path = (std::filesystem::path(config.checkpoint.save) / "log.jsonl").string();
  }
  JsonlLog log;
  if (!log_path.empty()) {
    log = JsonlLog(log_path, resumed_iteration > 0);
    std::string prefix = config.data.data_path.empty() ? "embedded default corpus"
                                                       : config.data.data_path;
    const HeaderIdentity identity{"reference", "cpu", "", options.reference_precision,
                                  options.reference_precision};
    log.write(header_record(identity, config, trainer.layout(), prefix, resumed_iteration));
  }
  if (options.audit_params > 0) {
    trainer.set_audit_elements(
        audit_elements(trainer.layout(), options.audit_params, config.data.seed));
  }

  const std::int64_t total_iterations = config.train_updates();
  out << "reference trainer (" << options.reference_precision << ", cpu): "
      << trainer.layout().total_elements << " parameters, " << total_iterations
      << " iterations of " << config.batch.global_batch_size << " samples x "
      << config.model.seq_length << " tokens\n";

  RunSummary summary;
  if (total_iterations == 0 && saving && resumed_iteration == 0) save();  // SPEC 12: iteration 0
  while (trainer.state().counters.iteration < total_iterations) {
    const IterationRecord record = trainer.run_iteration();
    if (summary.iterations == 0) summary.first_loss = record.loss;
    summary.last_loss = record.loss;
    ++summary.iterations;
    if (log.is_open()) log.write(record);
    if (!options.quiet) out << progress_line(record, total_iterations) << "\n" << std::flush;
    const auto& counters = trainer.state().counters;
    if (counters.consecutive_skips >= options.max_consecutive_skips) {
      if (saving) save();
      throw std::runtime_error(
          "iteration " + std::to_string(record.iteration) + ": " +
          std::to_string(counters.consecutive_skips) +
          " consecutive skipped updates (non-finite loss or gradient norm) reached "
          "--max-consecutive-skips " + std::to_string(options.max_consecutive_skips) +
          "; fix: inspect the batch and the learning rate, then resume from the last checkpoint");
    }
    const bool interval_due = config.checkpoint.save_interval > 0 &&
                              counters.iteration % config.checkpoint.save_interval == 0;
    const bool exit_due =
        options.exit_interval > 0 && counters.iteration % options.exit_interval == 0;
    if (saving && (interval_due || exit_due || counters.iteration == total_iterations)) save();
    if (exit_due) {
      out << "exiting at iteration " << counters.iteration << " (--exit-interval "
          << options.exit_interval << ")\n";
      break;
    }
  }
  summary.skipped_updates = trainer.state().counters.skipped_updates;
  return summary;
}

}  // namespace

std::function<Sample(std::int64_t)> open_training_samples(const RunConfig& config,
                                                          const TrainOptions& options) {
  std::string prefix = config.data.data_path;
  if (prefix.empty()) {
    const std::string directory =
        options.data_cache.empty() ? default_cache_directory() : options.data_cache;
    prefix = data::build_default_corpus_dataset(directory);
  }
  auto dataset = std::make_shared<const data::IndexedDataset>(data::IndexedDataset::open(prefix));
  auto source = std::make_shared<const data::SampleSource>(dataset, data::sample_source_config(config));
  return [source](std::int64_t index) { return source->sample(index); };
}

RunSummary run_reference_training(const RunConfig& config, const TrainOptions& options,
                                  std::ostream& out) {
  if (options.reference_precision == "double") return train_loop<double>(config, options, out);
  if (options.reference_precision == "float50") {
    return train_loop<boost::multiprecision::cpp_bin_float_50>(config, options, out);
  }
  throw std::runtime_error("--reference-precision " + options.reference_precision +
                           ": must be double or float50");
}

}  // namespace tandem::reference
