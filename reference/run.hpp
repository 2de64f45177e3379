// `tandem train --engine reference`: the whole run around the reference trainer — data, resume,
// the log's header and iteration records, progress lines, checkpoints, the skip limit.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/data/training_data.hpp"
#include "core/train/run_support.hpp"
#include "core/train/train_options.hpp"

namespace tandem::reference {

using tandem::RunSummary;  // what a finished run reports (core/train/run_support.hpp)

// Opens the run's data: --data-path (one dataset or a blend), or the embedded corpus built
// under options.data_cache ($TMPDIR/tandem-default-corpus when empty).
std::shared_ptr<const data::TrainingSamples> open_training_data(const RunConfig& config,
                                                                const TrainOptions& options);
// The same as the trainer reads it: blend sample i.
std::function<Sample(std::int64_t)> open_training_samples(const RunConfig& config,
                                                          const TrainOptions& options);

// Trains config.schedule.train_samples / GBS iterations in all (resuming from --load when given),
// writing progress to `out`. Throws std::runtime_error on a failure (e.g. the skip limit, after
// its final checkpoint) and ConfigError on a bad resume.
RunSummary run_reference_training(const RunConfig& config, const TrainOptions& options,
                                  std::ostream& out);

}  // namespace tandem::reference
