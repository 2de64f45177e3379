// From RunConfig to TrainingSamples (see training_data.hpp).
#include "core/data/training_data.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/config_issue.hpp"
#include "core/data/jsonl_builder.hpp"

namespace tandem::data {
namespace {

std::vector<double> weights_of(const std::vector<TrainingSamples::Dataset>& datasets) {
  std::vector<double> weights;
  for (const auto& dataset : datasets) weights.push_back(dataset.weight);
  return weights;
}

}  // namespace

std::string default_corpus_directory() {
  const char* tmp = std::getenv("TMPDIR");
  return (std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "tandem-default-corpus").string();
}

std::vector<DataPathEntry> resolve_data_path(const RunConfig& run, const std::string& work_directory) {
  if (!run.data.data_path.empty()) return run.data.data_path;
  const std::string directory = work_directory.empty() ? default_corpus_directory() : work_directory;
  return {{build_default_corpus_dataset(directory), {}}};
}

TrainingSamples::TrainingSamples(std::vector<Dataset> datasets, bool weights_from_sizes)
    : datasets_(std::move(datasets)),
      weights_from_sizes_(weights_from_sizes),
      index_(weights_of(datasets_)) {
  for (const auto& dataset : datasets_) {
    if (!dataset.samples) throw std::invalid_argument("TrainingSamples: " + dataset.prefix + " has no samples");
  }
}

Sample TrainingSamples::sample(std::int64_t global_index) const {
  const BlendPosition at = index_.at(global_index);
  Sample sample = datasets_[static_cast<std::size_t>(at.dataset)].samples->sample(at.dataset_sample);
  sample.global_index = global_index;
  return sample;
}

std::vector<std::int32_t> TrainingSamples::window_tokens(std::int64_t global_index) const {
  const BlendPosition at = index_.at(global_index);
  return datasets_[static_cast<std::size_t>(at.dataset)].samples->window_tokens(at.dataset_sample);
}

std::string TrainingSamples::summary() const {
  if (datasets_.size() == 1) return datasets_.front().prefix;
  std::ostringstream out;
  out << std::setprecision(6);
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    out << (d == 0 ? "" : " + ") << datasets_[d].weight << " x " << datasets_[d].prefix;
  }
  out << (weights_from_sizes_ ? " (weights: the datasets' samples per epoch)" : "");
  return out.str();
}

std::int64_t megatron_samples_per_epoch(const SampleSource& samples) {
  if (samples.config().data.packing == Packing::units) return samples.samples_in_epoch(0);
  return (samples.tokens_per_epoch() - 1) / samples.config().seq_length;
}

std::int64_t megatron_dataset_samples(const DataPathEntry& entry, std::size_t datasets,
                                     std::int64_t split_samples) {
  // Megatron's builder: one prefix without a weight is a GPTDataset of the split's size.
  if (!entry.weight) return datasets == 1 ? split_samples : 0;  // 0: one epoch (size None)
  // Weighted (even one prefix): _get_size_per_split_per_dataset with mid_level_dataset_surplus.
  const double target = std::ceil(static_cast<double>(split_samples) * *entry.weight);
  return static_cast<std::int64_t>(std::ceil(target * (1.0 + kMegatronBlendSurplus)));
}

std::shared_ptr<const TrainingSamples> open_training_samples(const RunConfig& run,
                                                             const std::string& work_directory) {
  return open_training_samples_at(resolve_data_path(run, work_directory), run);
}

std::shared_ptr<const TrainingSamples> open_training_samples_at(
    const std::vector<DataPathEntry>& data_path, const RunConfig& run, DatasetSplit split) {
  if (data_path.empty()) throw std::invalid_argument("open_training_samples_at: no dataset");
  // SPEC 13: without --tokenizer-type the data is the byte tokenizer's; a vocabulary other than
  // its 258 ids says it is not, and its EOD would be guessed wrong: refused, not guessed.
  if (!run.tokenizer.named() && run.model.vocab_size != kByteVocabularySize) {
    throw ConfigError({ConfigIssue{
        "--vocab-size", std::to_string(run.model.vocab_size),
        "says the data is not the byte tokenizer's (258 ids, EOD 256, PAD 257), the one a run without "
        "--tokenizer-type reads; its EOD would be guessed wrong",
        "name the tokenizer the data was built with: --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json "
        "--merge-file merges.txt, HuggingFaceTokenizer --tokenizer-model DIR, or NullTokenizer --vocab-size N "
        "(EOD = N - 1; --null-tokenizer-eod-id and --null-tokenizer-pad-id give others)"}});
  }
  SampleSourceConfig source_config = sample_source_config(run);
  source_config.split = split;
  const bool megatron_order = run.data.data_order == DataOrder::megatron;
  const std::int64_t split_samples = megatron_order ? megatron_num_samples(run, split) : 0;
  std::vector<TrainingSamples::Dataset> datasets;
  for (const auto& entry : data_path) {
    auto dataset = std::make_shared<const IndexedDataset>(IndexedDataset::open(entry.prefix));
    SampleSourceConfig dataset_config = source_config;
    if (megatron_order) dataset_config.megatron_num_samples = megatron_dataset_samples(entry, data_path.size(), split_samples);
    datasets.push_back({entry.prefix, entry.weight.value_or(1.0),
                        std::make_shared<const SampleSource>(std::move(dataset), dataset_config)});
  }
  const bool weights_from_sizes = data_path.size() > 1 && !data_path.front().weight;
  if (weights_from_sizes) {
    // Megatron's list of prefixes without weights: each weighs its samples per epoch.
    std::vector<double> sizes;
    for (const auto& dataset : datasets) {
      const std::int64_t size = megatron_samples_per_epoch(*dataset.samples);
      if (size < 1) {
        throw std::runtime_error(
            "--data-path " + dataset.prefix + ": its " + to_string(split) + " split holds no whole sample of " +
            std::to_string(run.model.seq_length) +
            " tokens, so weighting the blend by size gives it weight 0; fix: give weights "
            "(W1 P1 W2 P2 ...) or drop this dataset");
      }
      sizes.push_back(static_cast<double>(size));
    }
    const std::vector<double> weights = normalize_weights(sizes);
    for (std::size_t d = 0; d < datasets.size(); ++d) datasets[d].weight = weights[d];
  }
  return std::make_shared<const TrainingSamples>(std::move(datasets), weights_from_sizes);
}

nlohmann::json data_description(const TrainingSamples& samples, const RunConfig& run, bool embedded) {
  nlohmann::json out;
  const auto& datasets = samples.datasets();
  if (datasets.size() == 1) {
    out["prefix"] = embedded ? "embedded default corpus" : datasets.front().prefix;
  } else {
    nlohmann::json blend = nlohmann::json::array();
    for (const auto& dataset : datasets) {
      blend.push_back({{"prefix", dataset.prefix}, {"weight", dataset.weight}});
    }
    out["blend"] = blend;
    out["weights"] = samples.weights_from_sizes() ? "dataset sizes" : "given";
    out["rule"] = "Megatron's BlendedDataset: sample i from the dataset with the largest "
                  "w_d x max(i,1) - taken_d, the lowest d on ties (docs/DATA.md section 9)";
  }
  out["split"] = run.data.split.empty() ? "all documents train" : run.data.split;
  return out;
}

}  // namespace tandem::data
