// `--data-order megatron` (SPEC 13 "Sample order"; docs/DATA.md section 4): the sample order of
// Megatron Core's GPTDataset (megatron-core 0.16.1, megatron/core/datasets/gpt_dataset.py
// `_build_document_sample_shuffle_indices` and helpers.cpp `build_sample_idx`) for one dataset
// split, rebuilt here from the rules, not from their code:
//
//   epochs     the fewest whole epochs whose tokens reach num_samples * L + 1;
//   documents  the split's sequences repeated once per epoch, epoch after epoch, then shuffled as
//              ONE array by numpy's RandomState(seed) (so epochs interleave); when several epochs
//              are needed and the last one would supply fewer than int(0.8 x samples per epoch)
//              samples, the first epochs are shuffled together and the last one separately;
//   samples    sample s is the window of tokens [s L, s L + L + 1) of the documents concatenated in
//              that order (helpers.cpp walks the documents with a (document, offset) pair; for
//              every sample it records, the pair is this stream position), and there are
//              floor((epochs x E - 1) / L) of them (Megatron drops the last partial one);
//   shuffle    sample i of the dataset is window shuffle[i], a permutation drawn after the
//              documents' from the same generator (two ranges shuffled apart when the last
//              epoch is separate).
//
// How a window becomes a Sample (masks, positions: SPEC 3) stays tandem's (core/data/packing.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/indexed_dataset.hpp"
#include "core/data/split.hpp"

namespace tandem::data {

// What Megatron's GPTDataset is built from, besides the indexed dataset.
struct MegatronOrderConfig {
  std::int64_t seq_length = 0;   // L = GPTDatasetConfig.sequence_length (--seq-length), >= 1
  // The dataset's num_samples (Megatron's builder: --train-samples for train, the evaluation's
  // samples for valid); the dataset holds at least this many samples. >= 0.
  std::int64_t num_samples = 0;
  std::uint64_t seed = 1234;     // GPTDatasetConfig.random_seed = --seed, in [0, 2^32)
};

// The three indices of one GPTDataset split, as tandem keeps them: the document index as
// Megatron's (int32 sequence ids), the stream offset of each of its entries (instead of
// Megatron's sample index, which it determines), and the shuffle index.
class MegatronGptIndex {
 public:
  // Builds the indices of the sequences `range` of `dataset`. Throws std::invalid_argument on a
  // bad config (naming the option) and DatasetError when the split has no tokens.
  MegatronGptIndex(const IndexedDataset& dataset, SequenceRange range, MegatronOrderConfig config);

  // Samples the dataset holds: floor((epochs x E - 1) / L) (len(GPTDataset)).
  std::int64_t sample_count() const { return sample_count_; }
  std::int64_t epochs() const { return epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  std::int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  const MegatronOrderConfig& config() const { return config_; }

  // Megatron's document index: the sequence ids in stream order, [epochs x sequences].
  const std::vector<std::int32_t>& document_index() const { return document_index_; }
  // shuffle[i]: which window sample i reads; i in [0, sample_count()).
  std::int64_t shuffled(std::int64_t sample) const;
  // The first stream token of sample i: shuffled(i) x L.
  std::int64_t window_begin(std::int64_t sample) const;
  // The entry of document_index() that holds stream token `position`, and the token's offset in
  // that sequence.
  struct StreamPlace {
    std::size_t entry = 0;
    std::int64_t offset = 0;
  };
  StreamPlace place(std::int64_t position) const;

 private:
  MegatronOrderConfig config_;
  std::int64_t tokens_per_epoch_ = 0;  // E: the split's tokens
  std::int64_t epochs_ = 1;
  bool separate_final_epoch_ = false;
  std::int64_t sample_count_ = 0;
  std::vector<std::int32_t> document_index_;   // [epochs x sequences] sequence ids
  std::vector<std::int64_t> document_starts_;  // [entries + 1] stream offset of each entry
  // Megatron keeps uint32 below 2^32 - 1 samples, int64 above; so does tandem (memory).
  std::vector<std::uint32_t> shuffle32_;
  std::vector<std::int64_t> shuffle64_;
};

}  // namespace tandem::data
