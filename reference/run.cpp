// The reference run (run.hpp): data -> resume -> header -> iterations -> checkpoints.
#include "reference/run.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <nlohmann/json.hpp>

#include "core/data/tokenizer.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/data/packing.hpp"
#include "core/data/training_data.hpp"
#include "core/model_layout.hpp"
#include "core/train/audit_selection.hpp"
#include "core/train/records.hpp"
#include "core/checkpoint/save_lock.hpp"
#include "core/train/run_support.hpp"
#include "reference/checkpointing.hpp"
#include "reference/trainer.hpp"

namespace tandem::reference {
namespace {

template <class Real>
RunSummary train_loop(const RunConfig& config, const TrainOptions& options, std::ostream& out) {
  const auto data_path = data::resolve_data_path(config, options.data_cache);
  const auto data = data::open_training_samples_at(data_path, config);
  const auto samples = [data](std::int64_t index) { return data->sample(index); };
  // The validation split (docs/DATA.md section 12), opened only when the run evaluates.
  SampleProvider validation;
  if (config.evaluation.evaluates()) {
    const auto valid = data::open_training_samples_at(data_path, config, data::DatasetSplit::valid);
    validation = [valid](std::int64_t index) { return valid->sample(index); };
  }
  TestSwitches switches;
  switches.nonfinite_gradient_iterations = options.test_nonfinite_gradient_iterations;
  switches.nonfinite_loss_iterations = options.test_nonfinite_loss_iterations;
  Trainer<Real> trainer(config, samples, switches);

  // One run at a time in a --save directory (core/checkpoint/save_lock.hpp).
  std::optional<checkpoint::SaveLock> save_lock;
  if (!config.checkpoint.save.empty()) save_lock.emplace(config.checkpoint.save);

  std::int64_t resumed_iteration = 0;
  std::vector<std::string> resume_changes;
  if (resumes_from_load(config, out)) {
    if constexpr (std::is_same_v<Real, double>) {
      const auto state = checkpoint::load_checkpoint(config.checkpoint.load);
      resume_changes = describe_resume_changes(restore_checkpoint_state(trainer, state));
      resumed_iteration = trainer.state().counters.iteration;
      out << "resumed from " << config.checkpoint.load << " at iteration " << resumed_iteration
          << "\n";
      for (const std::string& change : resume_changes) out << "note: " << change << "\n";
    } else {
      throw std::runtime_error(
          "--load: only the double reference resumes bit-exactly; fix: drop "
          "--reference-precision float50 or --load");
    }
  }
  require_save_not_ahead(config, resumed_iteration);
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

  const std::string log_path = resolve_log_path(config, options);
  JsonlLog log;
  if (!log_path.empty()) {
    log = JsonlLog(log_path, resumed_iteration > 0);
    const HeaderIdentity identity{"reference", "cpu", "", options.reference_precision,
                                  options.reference_precision};
    log.write(header_record(identity, config, trainer.layout(),
                            data::data_description(*data, config, config.data.data_path.empty()),
                            resumed_iteration, resume_header_fields(config, resume_changes)));
  }
  if (options.audit_params > 0) {
    trainer.set_audit_elements(
        audit_elements(trainer.layout(), options.audit_params, config.data.seed));
  }

  const std::int64_t total_iterations = config.train_updates();
  out << "reference trainer (" << options.reference_precision << ", cpu): "
      << trainer.layout().total_elements << " parameters, " << total_iterations
      << " iterations of " << config.batch.global_batch_size << " samples x "
      << config.model.seq_length << " tokens\n"
      << "data: " << data->summary() << "\n"
      << "tokenizer: " << data::tokenizer_summary(config.tokenizer, config.model.vocab_size) << "\n"
      << evaluation_summary(config);

  IterationDriver driver;
  driver.run_iteration = [&trainer] { return trainer.run_iteration(); };
  driver.counters = [&trainer] { return trainer.state().counters; };
  if (saving) driver.save = save;
  if (validation) {
    driver.evaluate = [&trainer, &validation, &config] {
      return trainer.evaluate(validation, config.evaluation.eval_iters);
    };
  }
  return drive_iterations(config, options, resumed_iteration, driver, log, out);
}

}  // namespace

std::shared_ptr<const data::TrainingSamples> open_training_data(const RunConfig& config,
                                                                const TrainOptions& options) {
  return data::open_training_samples(config, options.data_cache);  // empty: the default folder
}

std::function<Sample(std::int64_t)> open_training_samples(const RunConfig& config,
                                                          const TrainOptions& options) {
  auto source = open_training_data(config, options);
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
