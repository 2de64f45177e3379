// From RunConfig to a SampleSource (see training_data.hpp).
#include "core/data/training_data.hpp"

#include <unistd.h>

#include <filesystem>

#include "core/data/jsonl_builder.hpp"

namespace tandem::data {

std::string resolve_dataset_prefix(const RunConfig& run, const std::string& work_directory) {
  if (!run.data.data_path.empty()) return run.data.data_path;
  const std::string directory =
      work_directory.empty()
          ? (std::filesystem::temp_directory_path() / ("tandem-corpus-" + std::to_string(::getuid())))
                .string()
          : work_directory;
  return build_default_corpus_dataset(directory);
}

std::shared_ptr<const SampleSource> open_training_samples(const RunConfig& run,
                                                          const std::string& work_directory) {
  return open_training_samples_at(resolve_dataset_prefix(run, work_directory), run);
}

std::shared_ptr<const SampleSource> open_training_samples_at(const std::string& prefix,
                                                             const RunConfig& run) {
  auto dataset = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  return std::make_shared<const SampleSource>(std::move(dataset), sample_source_config(run));
}

}  // namespace tandem::data
