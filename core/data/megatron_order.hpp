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
// With --data-cache-path the indices are cached in files and memory-mapped, as Megatron caches
// its .npy files (megatron_index_cache.cpp; docs/DATA.md section 4).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
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

// Where a MegatronGptIndex came from (--data-cache-path; docs/DATA.md section 4).
enum class IndexOrigin {
  built,             // computed in memory (no cache directory)
  built_and_cached,  // computed, then written to the cache directory
  loaded,            // memory-mapped from the cache directory
};
std::string to_string(IndexOrigin origin);

// The three indices of one GPTDataset split, as tandem keeps them: the document index as
// Megatron's (int32 sequence ids), the stream offset of each of its entries (instead of
// Megatron's sample index, which it determines), and the shuffle index. Held in memory or
// memory-mapped from a cache file (megatron_index_cache.cpp); read-only either way.
class MegatronGptIndex {
 public:
  // Builds the indices of the sequences `range` of `dataset` in memory. Throws
  // std::invalid_argument on a bad config (naming the option) and DatasetError when the split
  // has no tokens.
  MegatronGptIndex(const IndexedDataset& dataset, SequenceRange range, MegatronOrderConfig config);

  // The same indices through Megatron's --data-cache-path: loaded (memory-mapped) from
  // `cache_directory` when a valid file for this dataset, range and config is there, otherwise
  // built and written there atomically (temporary file, then rename) under a lock file, so that
  // ranks or threads opening the same index build it once and the others load it. A file that
  // fails validation (size, header, configuration, checksum) is reported on stderr and replaced.
  // One line on stderr says built or loaded, the file and the seconds. Throws DatasetError when
  // the directory cannot be created or written.
  static std::shared_ptr<const MegatronGptIndex> open(const IndexedDataset& dataset,
                                                      SequenceRange range,
                                                      MegatronOrderConfig config,
                                                      const std::string& cache_directory);

  // Samples the dataset holds: floor((epochs x E - 1) / L) (len(GPTDataset)).
  std::int64_t sample_count() const { return sample_count_; }
  std::int64_t epochs() const { return epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  std::int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  const MegatronOrderConfig& config() const { return config_; }
  IndexOrigin origin() const { return origin_; }
  const std::string& cache_file() const { return cache_file_; }  // empty when not cached

  // Megatron's document index: the sequence ids in stream order, [epochs x sequences].
  std::span<const std::int32_t> document_index() const { return document_index_; }
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
  // The arrays when built in memory.
  struct Arrays {
    std::vector<std::int32_t> document_index;
    std::vector<std::int64_t> document_starts;
    std::vector<std::uint32_t> shuffle32;
    std::vector<std::int64_t> shuffle64;
  };
  // Checks the config and computes the sizes (epochs, separate last epoch, samples) without
  // building an array; `lengths_hash` (may be null) receives a hash of the range's sequence
  // lengths, which identifies the data in a cache file.
  MegatronGptIndex(const IndexedDataset& dataset, SequenceRange range, MegatronOrderConfig config,
                   std::uint64_t* lengths_hash);
  void build_arrays(const IndexedDataset& dataset, SequenceRange range);
  void view(std::shared_ptr<const Arrays> arrays);
  bool narrow_shuffle() const;  // uint32 shuffle index (Megatron's rule)

  MegatronOrderConfig config_;
  std::int64_t tokens_per_epoch_ = 0;  // E: the split's tokens
  std::int64_t epochs_ = 1;
  bool separate_final_epoch_ = false;
  std::int64_t samples_before_final_epoch_ = 0;
  std::int64_t sample_count_ = 0;
  IndexOrigin origin_ = IndexOrigin::built;
  std::string cache_file_;
  // What the spans below view: the Arrays built, or the mapped cache file.
  std::shared_ptr<const void> storage_;
  std::span<const std::int32_t> document_index_;   // [epochs x sequences] sequence ids
  std::span<const std::int64_t> document_starts_;  // [entries + 1] stream offset of each entry
  // Megatron keeps uint32 below 2^32 - 1 samples, int64 above; so does tandem (memory). One of
  // the two is empty.
  std::span<const std::uint32_t> shuffle32_;
  std::span<const std::int64_t> shuffle64_;
};

}  // namespace tandem::data
