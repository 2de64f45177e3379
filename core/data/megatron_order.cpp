// Megatron Core's GPTDataset indices (see megatron_order.hpp for the rules).
#include "core/data/megatron_order.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "core/data/numpy_random.hpp"

namespace tandem::data {

namespace {

// Megatron separates the last epoch's shuffle when it supplies fewer than this share of an
// epoch's samples (gpt_dataset.py: threshold = 0.80).
constexpr double kSeparateFinalEpochThreshold = 0.80;
// Megatron always builds GPT samples with add_extra_token_to_sequence = True: L + 1 tokens.
constexpr std::int64_t kExtraToken = 1;

// The split's sequences repeated `epochs` times (epoch-major), shuffled once (Megatron's
// _build_document_index without the separate last epoch).
std::vector<std::int32_t> shuffled_documents(SequenceRange range, std::int64_t epochs,
                                             NumpyRandomState& random) {
  std::vector<std::int32_t> documents;
  documents.reserve(static_cast<std::size_t>(epochs * range.size()));
  for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (std::int64_t sequence = range.begin; sequence < range.end; ++sequence) {
      documents.push_back(static_cast<std::int32_t>(sequence));
    }
  }
  random.shuffle(std::span<std::int32_t>(documents));
  return documents;
}

// [begin, end) shuffled (Megatron's _build_shuffle_index, one range).
template <typename T>
void append_shuffled_range(std::vector<T>& out, std::int64_t begin, std::int64_t end,
                           NumpyRandomState& random) {
  const std::size_t first = out.size();
  for (std::int64_t value = begin; value < end; ++value) out.push_back(static_cast<T>(value));
  random.shuffle(std::span<T>(out).subspan(first));
}

}  // namespace

std::string to_string(IndexOrigin origin) {
  switch (origin) {
    case IndexOrigin::built: return "built";
    case IndexOrigin::built_and_cached: return "built and cached";
    case IndexOrigin::loaded: return "loaded";
  }
  return "?";
}

MegatronGptIndex::MegatronGptIndex(const IndexedDataset& dataset, SequenceRange range,
                                   MegatronOrderConfig config)
    : MegatronGptIndex(dataset, range, config, nullptr) {
  build_arrays(dataset, range);
}

MegatronGptIndex::MegatronGptIndex(const IndexedDataset& dataset, SequenceRange range,
                                   MegatronOrderConfig config, std::uint64_t* lengths_hash)
    : config_(config) {
  const std::int64_t length = config_.seq_length;
  if (length < 1) {
    throw std::invalid_argument("--seq-length = " + std::to_string(length) +
                                ": expected at least 1; fix: give a positive length");
  }
  if (config_.num_samples < 0) {
    throw std::invalid_argument("--data-order megatron: num_samples = " +
                                std::to_string(config_.num_samples) + "; expected >= 0");
  }
  if (range.end > std::numeric_limits<std::int32_t>::max()) {
    throw DatasetError(dataset.prefix() + ": " + std::to_string(range.end) +
                       " sequences; Megatron's document index is int32; fix: split the dataset");
  }
  // FNV-1a over the lengths: a cache file names the data it was built from by this hash.
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::int64_t sequence = range.begin; sequence < range.end; ++sequence) {
    const std::int32_t tokens = dataset.sequence_length(sequence);
    tokens_per_epoch_ += tokens;
    hash = (hash ^ static_cast<std::uint32_t>(tokens)) * 0x100000001b3ULL;
  }
  if (lengths_hash != nullptr) *lengths_hash = hash;
  if (tokens_per_epoch_ == 0) {
    throw DatasetError(dataset.prefix() + ": sequences [" + std::to_string(range.begin) + ", " +
                       std::to_string(range.end) + ") hold no tokens; expected at least 1; fix: "
                       "use a larger dataset or give this split a larger weight");
  }
  // Epochs: the fewest whose tokens reach num_samples * L + 1 (_get_num_epochs).
  std::int64_t tokens_requested = 0;
  if (__builtin_mul_overflow(config_.num_samples, length, &tokens_requested) ||
      __builtin_add_overflow(tokens_requested, kExtraToken, &tokens_requested)) {
    throw std::invalid_argument("--data-order megatron: " + std::to_string(config_.num_samples) +
                                " samples x --seq-length " + std::to_string(length) +
                                " overflows int64; fix: ask for fewer samples");
  }
  epochs_ = 1;
  for (std::int64_t tokens = tokens_per_epoch_; tokens < tokens_requested; tokens += tokens_per_epoch_) {
    ++epochs_;
  }
  if (epochs_ > 1) {
    samples_before_final_epoch_ = ((epochs_ - 1) * tokens_per_epoch_ - kExtraToken) / length;
    const std::int64_t from_final_epoch = config_.num_samples - samples_before_final_epoch_;
    const std::int64_t per_epoch = (tokens_per_epoch_ - kExtraToken) / length;
    separate_final_epoch_ = from_final_epoch <
        static_cast<std::int64_t>(kSeparateFinalEpochThreshold * static_cast<double>(per_epoch));
  }
  // build_sample_idx with drop_last_partial_sequence (train always; valid by Megatron's default).
  sample_count_ = (epochs_ * tokens_per_epoch_ - kExtraToken) / length;
}

bool MegatronGptIndex::narrow_shuffle() const {
  return sample_count_ < static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max()) - 1;
}

void MegatronGptIndex::build_arrays(const IndexedDataset& dataset, SequenceRange range) {
  auto arrays = std::make_shared<Arrays>();
  NumpyRandomState random(config_.seed);
  if (separate_final_epoch_) {
    arrays->document_index = shuffled_documents(range, epochs_ - 1, random);
    const auto last = shuffled_documents(range, 1, random);
    arrays->document_index.insert(arrays->document_index.end(), last.begin(), last.end());
  } else {
    arrays->document_index = shuffled_documents(range, epochs_, random);
  }
  arrays->document_starts.reserve(arrays->document_index.size() + 1);
  std::int64_t offset = 0;
  for (const std::int32_t sequence : arrays->document_index) {
    arrays->document_starts.push_back(offset);
    offset += dataset.sequence_length(sequence);
  }
  arrays->document_starts.push_back(offset);

  const std::int64_t first_range = separate_final_epoch_ ? samples_before_final_epoch_ : sample_count_;
  auto shuffle = [&](auto& out) {
    out.reserve(static_cast<std::size_t>(sample_count_));
    append_shuffled_range(out, 0, first_range, random);
    if (first_range != sample_count_) append_shuffled_range(out, first_range, sample_count_, random);
  };
  if (narrow_shuffle()) shuffle(arrays->shuffle32);
  else shuffle(arrays->shuffle64);
  view(std::move(arrays));
}

void MegatronGptIndex::view(std::shared_ptr<const Arrays> arrays) {
  document_index_ = arrays->document_index;
  document_starts_ = arrays->document_starts;
  shuffle32_ = arrays->shuffle32;
  shuffle64_ = arrays->shuffle64;
  storage_ = std::move(arrays);
}

std::int64_t MegatronGptIndex::shuffled(std::int64_t sample) const {
  if (sample < 0 || sample >= sample_count_) {
    throw std::out_of_range(
        "--data-order megatron: sample " + std::to_string(sample) + " is past the " +
        std::to_string(sample_count_) + " samples Megatron's GPTDataset holds for num_samples " +
        std::to_string(config_.num_samples) + " (" + std::to_string(epochs_) +
        " epochs); fix: build the order for more samples (--train-samples, --eval-iters)");
  }
  const auto at = static_cast<std::size_t>(sample);
  return narrow_shuffle() ? static_cast<std::int64_t>(shuffle32_[at]) : shuffle64_[at];
}

std::int64_t MegatronGptIndex::window_begin(std::int64_t sample) const {
  return shuffled(sample) * config_.seq_length;
}

MegatronGptIndex::StreamPlace MegatronGptIndex::place(std::int64_t position) const {
  if (position < 0 || position >= document_starts_.back()) {
    throw std::out_of_range("MegatronGptIndex::place: stream token " + std::to_string(position) +
                            " outside [0, " + std::to_string(document_starts_.back()) + ")");
  }
  // The last entry starting at or before `position`: empty sequences share their successor's
  // start, so this is the one that holds the token.
  const auto found = std::upper_bound(document_starts_.begin(), document_starts_.end(), position);
  const auto entry = static_cast<std::size_t>(found - document_starts_.begin() - 1);
  return {entry, position - document_starts_[entry]};
}

}  // namespace tandem::data
