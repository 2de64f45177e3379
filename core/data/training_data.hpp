// One call from a run's configuration to its training samples: --data-path PREFIX when given,
// otherwise the embedded corpus (fixtures/corpus/default.jsonl) built into a dataset first.
#pragma once

#include <memory>
#include <string>

#include "core/config.hpp"
#include "core/data/packing.hpp"

namespace tandem::data {

// The dataset prefix a run reads: run.data.data_path, or the embedded corpus built under
// `work_directory` (empty: a per-user folder under the system temporary directory). Building is
// skipped when the files there already hold the corpus; with several ranks, call this on one
// rank before the others open the result.
std::string resolve_dataset_prefix(const RunConfig& run, const std::string& work_directory = "");

// The train split of that dataset, packed as the run asks (SPEC 2, 3).
std::shared_ptr<const SampleSource> open_training_samples(const RunConfig& run,
                                                          const std::string& work_directory = "");
// The same from a prefix resolve_dataset_prefix already returned.
std::shared_ptr<const SampleSource> open_training_samples_at(const std::string& prefix,
                                                             const RunConfig& run);

}  // namespace tandem::data
