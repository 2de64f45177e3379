// One call from a run's configuration to its training samples: the --data-path datasets (one
// prefix, or Megatron's blend of several, core/data/blend.hpp) when given, otherwise the
// embedded corpus (fixtures/corpus/default.jsonl) built into a dataset first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/config.hpp"
#include "core/data/blend.hpp"
#include "core/data/packing.hpp"

namespace tandem::data {

// Where the embedded corpus is built when --data-cache is not given: $TMPDIR/tandem-default-corpus
// (/tmp when TMPDIR is unset), the default `tandem train --help` and `tandem check --help` name.
std::string default_corpus_directory();

// The datasets a run reads: run.data.data_path, or the embedded corpus built under
// `work_directory` (empty: default_corpus_directory()) as one entry without a weight. Building is skipped when the files there already hold the corpus;
// with several ranks, call this on one rank before the others open the result.
std::vector<DataPathEntry> resolve_data_path(const RunConfig& run,
                                             const std::string& work_directory = "");

// The samples a run trains on: blend sample i is sample BlendingIndex::at(i).dataset_sample of
// dataset BlendingIndex::at(i).dataset (docs/DATA.md section 9). Each dataset is an ordinary
// SampleSource with the run's whole data section: the same --split applies to each (as
// Megatron applies it to each prefix), the same --seed orders each one's documents, and each
// continues into its next epoch when it runs out. One dataset: sample i is its sample i.
// Thread-safe.
class TrainingSamples {
 public:
  struct Dataset {
    std::string prefix;                            // PREFIX of PREFIX.bin / PREFIX.idx
    double weight = 1.0;                           // normalized blend weight in (0, 1]
    std::shared_ptr<const SampleSource> samples;   // its train split, packed
  };
  // `weights_from_sizes`: true when --data-path gave no weights (recorded for the log header).
  TrainingSamples(std::vector<Dataset> datasets, bool weights_from_sizes);

  // Blend sample `global_index`, with Sample::global_index = global_index.
  Sample sample(std::int64_t global_index) const;
  // The seq+1 tokens sample(global_index) is built from.
  std::vector<std::int32_t> window_tokens(std::int64_t global_index) const;
  BlendPosition position(std::int64_t global_index) const { return index_.at(global_index); }

  const std::vector<Dataset>& datasets() const { return datasets_; }
  bool weights_from_sizes() const { return weights_from_sizes_; }
  // "0.3 x /data/web + 0.7 x /data/code" (weights to 6 significant digits), or the one prefix.
  std::string summary() const;

 private:
  std::vector<Dataset> datasets_;
  bool weights_from_sizes_ = false;
  BlendingIndex index_;
};

// Samples per epoch of a dataset as Megatron counts a one-epoch GPTDataset: concat packing
// floor((E - 1) / L) whole windows (E = the split's tokens); unit packing, epoch 0's windows.
// The weight of each dataset when --data-path lists prefixes without weights.
std::int64_t megatron_samples_per_epoch(const SampleSource& samples);

// Megatron's mid_level_dataset_surplus (BlendedMegatronDatasetConfig default): a weighted blend
// builds each dataset for 0.5 % more samples than its share.
inline constexpr double kMegatronBlendSurplus = 0.005;

// --data-order megatron: the num_samples Megatron's builder gives the GPTDataset of `entry`
// (docs/DATA.md section 4) when its blend of `datasets` entries reads `split_samples`: the split's
// samples for a lone prefix without weight; ceil(ceil(split_samples x w) x (1 + surplus)) for a
// weighted entry (even a lone one: Megatron then builds a BlendedDataset); 0 for a blend weighted
// by sizes (Megatron builds each for one epoch, num_samples None, which 0 reproduces).
std::int64_t megatron_dataset_samples(const DataPathEntry& entry, std::size_t datasets,
                                     std::int64_t split_samples);

// The train split of those datasets, packed as the run asks (SPEC 2, 3), blended when several.
std::shared_ptr<const TrainingSamples> open_training_samples(
    const RunConfig& run, const std::string& work_directory = "");
// The same from entries resolve_data_path already returned; `split` chooses the --split part
// (DatasetSplit::valid: the samples evaluation reads, docs/DATA.md section 12). Every part is
// read alike: the same packing, masks, --seed document order and blend rule, each dataset
// restricted to that part's sequences (a blend weighted by sizes uses that part's sizes, as
// Megatron builds each split's blend).
std::shared_ptr<const TrainingSamples> open_training_samples_at(
    const std::vector<DataPathEntry>& data_path, const RunConfig& run,
    DatasetSplit split = DatasetSplit::train);

// The log header's "data" object (SPEC 12): {"prefix": P} for one dataset or {"blend":
// [{"prefix", "weight"}...], "weights": "given" | "dataset sizes"} for several; "split" always.
// `embedded`: the embedded corpus trains (no --data-path); its prefix is then named as such.
nlohmann::json data_description(const TrainingSamples& samples, const RunConfig& run,
                                bool embedded);

}  // namespace tandem::data
