// `tandem train --engine production`: the run around the production trainer, as
// reference/run.hpp is around the reference — data, resume, the log's header and iteration
// records, progress lines, checkpoints (F32), the skip limit, --exit-interval.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "core/config.hpp"
#include "core/train/run_support.hpp"
#include "core/train/train_options.hpp"
#include "production/backend.hpp"

namespace tandem::production {

// What a finished run reports (core/train/run_support.hpp), and the backend that ran it.
struct RunSummary : tandem::RunSummary {
  Device device = Device::cpu;
};

// The device a run uses: --device when given; otherwise cuda when the cuda backend is built and
// a device answers, else cpu. Throws std::runtime_error for an unknown name.
Device choose_device(const std::string& requested);

// Trains config.schedule.train_samples / GBS iterations in all (resuming from --load when given),
// writing progress to `out`. Throws std::runtime_error on a failure (the skip limit, after its
// final checkpoint; --device cuda without the cuda backend) and ConfigError on a bad resume.
RunSummary run_production_training(const RunConfig& config, const TrainOptions& options,
                                   std::ostream& out);

}  // namespace tandem::production
