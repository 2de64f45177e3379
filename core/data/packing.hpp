// From an indexed dataset to training samples (SPEC 2, 3): the stream of documents in epoch
// order, cut into windows by concat or unit packing, each window turned into a Sample with its
// labels, loss mask, positions and attention spans; and Megatron's order of samples over
// microbatches and data-parallel ranks. The exact rules are written out in docs/DATA.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/data/indexed_dataset.hpp"
#include "core/data/megatron_order.hpp"
#include "core/data/sample.hpp"
#include "core/data/split.hpp"

namespace tandem::data {

// What turns a window of tokens into a Sample (SPEC 3).
struct MaskRules {
  bool reset_position_ids = true;    // positions restart at 0 after each EOD
  bool reset_attention_mask = true;  // attention stays inside each document
  bool eod_mask_loss = true;         // loss mask 0 where the input token is EOD
  std::int32_t eod_token = kEodToken;  // the tokenizer's (SPEC 13)
  std::int32_t pad_token = kPadToken;  // the tokenizer's; kNoPadToken (-1): padding reads as 0
};
MaskRules mask_rules(const DataConfig& data);

// Builds the sample of one window of seq+1 tokens (SPEC 2, 3): inputs = window[0:seq],
// labels = window[1:seq+1]; positions, attention_start, loss mask and the three counters.
Sample build_sample(std::int64_t global_index, std::span<const std::int32_t> window,
                    const MaskRules& rules);

// Everything a SampleSource needs besides the dataset.
struct SampleSourceConfig {
  DataConfig data;                                // order, packing, split, masks, seed
  std::int64_t seq_length = 32;                   // L: input positions per sample
  std::int64_t vocab_size = kByteVocabularySize;  // every token read must lie in [0, vocab)
  DatasetSplit split = DatasetSplit::train;       // which --split range to read
  std::int32_t eod_token = kEodToken;             // the tokenizer's EOD (byte tokenizer: 256)
  std::int32_t pad_token = kPadToken;             // the tokenizer's PAD (257); kNoPadToken: none
  // Tokens of the split, from its first sequence, held to [0, vocab) when the source is built,
  // so data of another tokenizer stops a run before training; every window is checked again.
  std::int64_t precheck_tokens = std::int64_t{1} << 20;
  // --data-order megatron only: Megatron's num_samples for this split's GPTDataset (the train
  // split: --train-samples; valid: the evaluation's samples; megatron_num_samples()). -1 = unset,
  // an error under that order.
  std::int64_t megatron_num_samples = -1;
};
// From a run's configuration: its data section, seq_length and vocab_size, its tokenizer's EOD
// and PAD (RunConfig::tokenizer), the train split.
SampleSourceConfig sample_source_config(const RunConfig& run);

// Megatron's num_samples for the GPTDataset of `split` (megatron-core's builder, sizes from
// Megatron-LM's get_train_valid_test_num_samples): train: --train-samples; valid:
// (train updates // --eval-interval + 1) x --eval-iters x global batch, the "+ 1" alone when
// --eval-interval is unset (0); test: --eval-iters x global batch.
std::int64_t megatron_num_samples(const RunConfig& run, DatasetSplit split);

// The training samples of one dataset split: sample(i) for any i >= 0 (the stream never ends;
// epoch e+1 follows epoch e). Thread-safe; epoch layouts are computed on demand and cached.
// Under --data-order megatron the samples are Megatron's GPTDataset's (megatron_order.hpp):
// sample(i) exists for i < megatron_index()->sample_count() only, and the epoch bookkeeping
// below (tandem's orders' epochs) does not describe them.
class SampleSource {
 public:
  SampleSource(std::shared_ptr<const IndexedDataset> dataset, SampleSourceConfig config);

  Sample sample(std::int64_t global_index) const;
  // The seq+1 tokens sample(global_index) is built from (PAD where unit packing pads).
  std::vector<std::int32_t> window_tokens(std::int64_t global_index) const;  // [seq+1]

  std::int64_t tokens_per_epoch() const { return tokens_per_epoch_; }  // E: split's tokens
  std::int64_t sequences_per_epoch() const { return range_.size(); }
  SequenceRange sequence_range() const { return range_; }
  // Epoch bookkeeping. Concat: sample i belongs to the epoch holding its first token i*L, so
  // epoch e starts at sample ceil(e*E/L). Units: windows never straddle epochs (docs/DATA.md),
  // so each epoch has its own whole number of windows.
  std::int64_t first_sample_of_epoch(std::int64_t epoch) const;
  std::int64_t samples_in_epoch(std::int64_t epoch) const;
  std::int64_t samples_per_epoch() const { return samples_in_epoch(0); }
  std::int64_t epoch_of_sample(std::int64_t global_index) const;
  // The dataset sequence ids in the order `epoch` visits them (split range applied).
  std::vector<std::int64_t> sequence_order(std::int64_t epoch) const;

  const SampleSourceConfig& config() const { return config_; }
  // Megatron's indices under --data-order megatron; null otherwise.
  const MegatronGptIndex* megatron_index() const { return megatron_.get(); }

 private:
  // One piece of a sequence placed in a unit-packing window.
  struct Piece {
    std::int64_t sequence = 0;     // dataset sequence id
    std::int64_t token_begin = 0;  // first token of the piece within the sequence
    std::int64_t token_count = 0;  // tokens of the piece (<= L+1)
  };
  struct EpochLayout {
    std::vector<std::int64_t> order;           // [sequences] dataset ids in visiting order
    std::vector<std::int64_t> token_starts;    // [sequences+1] concat: stream offset of each
    std::vector<Piece> pieces;                 // units: pieces in window order
    std::vector<std::int64_t> window_starts;   // units: [windows+1] first piece of each window
  };

  std::shared_ptr<const EpochLayout> layout(std::int64_t epoch) const;
  std::shared_ptr<EpochLayout> build_layout(std::int64_t epoch) const;
  // Caches a layout, evicting the lowest epochs beyond a few; the caller holds mutex_.
  void remember_locked(std::int64_t key, std::shared_ptr<const EpochLayout> epoch_layout) const;
  void read_stream(std::int64_t stream_begin, std::span<std::int32_t> out) const;
  void read_unit_window(std::int64_t global_index, std::span<std::int32_t> out) const;
  void read_megatron_window(std::int64_t global_index, std::span<std::int32_t> out) const;
  void check_tokens(std::span<const std::int32_t> window, std::int64_t global_index) const;
  void precheck_tokens() const;  // the split's first tokens against the vocabulary, at construction
  std::string out_of_vocabulary(std::int32_t token, const std::string& where) const;

  std::shared_ptr<const IndexedDataset> dataset_;
  SampleSourceConfig config_;
  MaskRules rules_;
  SequenceRange range_;
  std::int64_t tokens_per_epoch_ = 0;
  std::shared_ptr<const MegatronGptIndex> megatron_;  // --data-order megatron only

  mutable std::mutex mutex_;
  mutable std::map<std::int64_t, std::shared_ptr<const EpochLayout>> cache_;  // a few epochs
  mutable std::vector<std::int64_t> unit_epoch_starts_;  // units: first sample of epoch 0..k
};

// Where one microbatch sits in an iteration (SPEC 2, Megatron's sampler).
struct MicrobatchPosition {
  std::int64_t consumed_samples = 0;    // samples consumed before this iteration
  std::int64_t microbatch = 0;          // m, in [0, microbatches per replica)
  std::int64_t data_parallel_rank = 0;  // r, in [0, DP)
  std::int64_t micro_batch_size = 1;    // mbs
  std::int64_t data_parallel_size = 1;  // DP
};

// SPEC 2: microbatch m on DP rank r takes global samples
// consumed + m*mbs*DP + r*mbs + [0, mbs). Throws std::invalid_argument on a bad position.
std::vector<std::int64_t> microbatch_sample_indices(const MicrobatchPosition& position);

}  // namespace tandem::data
