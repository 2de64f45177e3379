// Concat and unit packing, masks and positions, and the sample order over ranks (SPEC 2, 3);
// see packing.hpp and docs/DATA.md for the rules implemented here.
#include "core/data/packing.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/data/document_order.hpp"

namespace tandem::data {

namespace {

constexpr std::size_t kCachedEpochs = 4;  // layouts kept; training walks epochs forward

std::int64_t checked_multiply(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw std::overflow_error(std::string(what) + ": " + std::to_string(a) + " x " +
                              std::to_string(b) + " overflows int64");
  }
  return product;
}

std::int64_t ceil_div(std::int64_t numerator, std::int64_t denominator) {
  return numerator / denominator + (numerator % denominator != 0 ? 1 : 0);
}

}  // namespace

MaskRules mask_rules(const DataConfig& data) {
  MaskRules rules;
  rules.reset_position_ids = data.reset_position_ids;
  rules.reset_attention_mask = data.reset_attention_mask;
  rules.eod_mask_loss = data.eod_mask_loss;
  return rules;
}

Sample build_sample(std::int64_t global_index, std::span<const std::int32_t> window,
                    const MaskRules& rules) {
  if (window.size() < 2) {
    throw std::invalid_argument("build_sample: a window holds seq+1 >= 2 tokens, got " +
                                std::to_string(window.size()));
  }
  const std::size_t seq = window.size() - 1;
  Sample sample;
  sample.global_index = global_index;
  sample.tokens.assign(window.begin(), window.end() - 1);  // [seq] inputs = window[0:seq]
  sample.labels.assign(window.begin() + 1, window.end());  // [seq] labels = window[1:seq+1]
  sample.loss_mask.resize(seq);                            // [seq]
  sample.positions.resize(seq);                            // [seq]
  sample.attention_start.resize(seq);                      // [seq]

  std::int32_t position = 0;        // running position of the current document
  std::int32_t document_start = 0;  // first position of the current document in this window
  for (std::size_t t = 0; t < seq; ++t) {
    const auto index = static_cast<std::int32_t>(t);
    const std::int32_t input = sample.tokens[t];
    const std::int32_t label = sample.labels[t];
    // SPEC 3: the token after an EOD starts a new document at position 0; the EOD itself keeps
    // its document's running position.
    if (t > 0 && sample.tokens[t - 1] == rules.eod_token) {
      position = 0;
      document_start = index;
    }
    sample.positions[t] = rules.reset_position_ids ? position : index;
    const bool is_pad = input == rules.pad_token;
    if (is_pad) {
      sample.attention_start[t] = index;  // PAD attends only to itself (sample.hpp)
    } else {
      sample.attention_start[t] = rules.reset_attention_mask ? document_start : 0;
    }
    // SPEC 3: no loss where the input is EOD (eod_mask_loss) or input or label is PAD.
    const bool masked = is_pad || label == rules.pad_token ||
                        (rules.eod_mask_loss && input == rules.eod_token);
    sample.loss_mask[t] = masked ? 0 : 1;
    sample.input_tokens += is_pad ? 0 : 1;
    sample.pad_tokens += is_pad ? 1 : 0;
    sample.loss_tokens += sample.loss_mask[t];
    ++position;
  }
  // A tokenizer without PAD pads with kNoPadToken (-1), which has no embedding row: as
  // Megatron's GPTDataset, the masks are taken first, then padding reads as token 0.
  if (rules.pad_token < 0) {
    for (auto* ids : {&sample.tokens, &sample.labels}) {
      for (std::int32_t& id : *ids) id = id == rules.pad_token ? 0 : id;
    }
  }
  return sample;
}

SampleSourceConfig sample_source_config(const RunConfig& run) {
  SampleSourceConfig config;
  config.data = run.data;
  config.seq_length = run.model.seq_length;
  config.vocab_size = run.model.vocab_size;
  config.eod_token = run.tokenizer.eod_token;  // SPEC 13: from the tokenizer the data was built with
  config.pad_token = run.tokenizer.pad_token;
  if (run.data.data_order == DataOrder::megatron) {
    config.megatron_num_samples = megatron_num_samples(run, DatasetSplit::train);
  }
  return config;
}

// ---- SampleSource -----------------------------------------------------------------------------

SampleSource::SampleSource(std::shared_ptr<const IndexedDataset> dataset, SampleSourceConfig config)
    : dataset_(std::move(dataset)), config_(std::move(config)), rules_(mask_rules(config_.data)) {
  if (!dataset_) throw std::invalid_argument("SampleSource: no dataset");
  rules_.eod_token = config_.eod_token;
  rules_.pad_token = config_.pad_token;
  if (config_.seq_length < 1) {
    throw std::invalid_argument("SampleSource: --seq-length = " +
                                std::to_string(config_.seq_length) +
                                "; expected at least 1; fix: give a positive length");
  }
  range_ = split_range(config_.data.split, dataset_->sequence_count(), config_.split);
  for (std::int64_t sequence = range_.begin; sequence < range_.end; ++sequence) {
    tokens_per_epoch_ += dataset_->sequence_length(sequence);
  }
  if (tokens_per_epoch_ == 0) {
    throw DatasetError(dataset_->prefix() + ": the " + to_string(config_.split) +
                       " split (sequences [" + std::to_string(range_.begin) + ", " +
                       std::to_string(range_.end) + ") of " +
                       std::to_string(dataset_->sequence_count()) +
                       (config_.data.split.empty() ? "" : ", --split " + config_.data.split) +
                       ") has no tokens; expected at least 1; fix: use a larger dataset or give "
                       "this split a larger weight");
  }
  precheck_tokens();
  if (config_.data.data_order == DataOrder::megatron) {
    if (config_.data.packing != Packing::concat) {
      throw std::invalid_argument("--data-order megatron needs --packing concat (Megatron's GPTDataset)");
    }
    if (config_.megatron_num_samples < 0) {
      throw std::invalid_argument("SampleSource: --data-order megatron needs megatron_num_samples");
    }
    const MegatronOrderConfig order{config_.seq_length, config_.megatron_num_samples, config_.data.seed};
    megatron_ = config_.data.data_cache_path.empty()
                    ? std::make_shared<const MegatronGptIndex>(*dataset_, range_, order)
                    : MegatronGptIndex::open(*dataset_, range_, order, config_.data.data_cache_path);
  }
}

std::int64_t megatron_num_samples(const RunConfig& run, DatasetSplit split) {
  const std::int64_t global_batch = run.batch.global_batch_size;
  switch (split) {
    case DatasetSplit::train:
      return run.schedule.train_samples;
    case DatasetSplit::valid: {
      const std::int64_t interval = run.evaluation.eval_interval;
      const std::int64_t evaluations = (interval > 0 ? run.train_updates() / interval : 0) + 1;
      return checked_multiply(checked_multiply(evaluations, run.evaluation.eval_iters, "evaluations x eval iters"),
                              global_batch, "eval iters x global batch");
    }
    case DatasetSplit::test:
      return checked_multiply(run.evaluation.eval_iters, global_batch, "eval iters x global batch");
  }
  return 0;
}

std::vector<std::int64_t> SampleSource::sequence_order(std::int64_t epoch) const {
  if (epoch < 0) throw std::invalid_argument("epoch " + std::to_string(epoch) + " < 0");
  const bool shuffled = config_.data.data_order == DataOrder::shuffled;
  auto order = epoch_order(range_.size(), shuffled, config_.data.seed,
                           static_cast<std::uint64_t>(epoch));
  for (auto& position : order) position += range_.begin;
  return order;
}

std::shared_ptr<SampleSource::EpochLayout> SampleSource::build_layout(std::int64_t epoch) const {
  auto layout = std::make_shared<EpochLayout>();
  layout->order = sequence_order(epoch);
  if (config_.data.packing == Packing::concat) {
    layout->token_starts.reserve(layout->order.size() + 1);
    std::int64_t offset = 0;
    for (std::int64_t sequence : layout->order) {
      layout->token_starts.push_back(offset);
      offset += dataset_->sequence_length(sequence);
    }
    layout->token_starts.push_back(offset);
    return layout;
  }
  // Unit packing (SPEC 2; docs/DATA.md): a window holds L+1 token slots. A sequence of at most
  // L+1 tokens is one piece; a longer one is cut into pieces [k*L, k*L + L+1) that overlap by
  // one token, so every token but the first is a label exactly once. Pieces go into the current
  // window while they fit; otherwise the window is closed (its rest is PAD) and a new one opens.
  // The last window of an epoch is closed at the epoch's end.
  const std::int64_t slots = config_.seq_length + 1;
  std::int64_t filled = slots;  // no window open yet
  auto place = [&](const Piece& piece) {
    if (filled + piece.token_count > slots) {
      layout->window_starts.push_back(static_cast<std::int64_t>(layout->pieces.size()));
      filled = 0;
    }
    layout->pieces.push_back(piece);
    filled += piece.token_count;
  };
  for (std::int64_t sequence : layout->order) {
    const std::int64_t length = dataset_->sequence_length(sequence);
    if (length == 0) continue;
    if (length <= slots) {
      place(Piece{sequence, 0, length});
      continue;
    }
    for (std::int64_t begin = 0; begin + 1 < length; begin += config_.seq_length) {
      place(Piece{sequence, begin, std::min(slots, length - begin)});
    }
  }
  layout->window_starts.push_back(static_cast<std::int64_t>(layout->pieces.size()));
  return layout;
}

std::shared_ptr<const SampleSource::EpochLayout> SampleSource::layout(std::int64_t epoch) const {
  // Sequential order visits the same layout every epoch.
  const std::int64_t key = config_.data.data_order == DataOrder::shuffled ? epoch : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = cache_.find(key); found != cache_.end()) return found->second;
  std::shared_ptr<const EpochLayout> built = build_layout(key);
  remember_locked(key, built);
  return built;
}

void SampleSource::remember_locked(std::int64_t key,
                                   std::shared_ptr<const EpochLayout> epoch_layout) const {
  cache_.emplace(key, std::move(epoch_layout));
  while (cache_.size() > kCachedEpochs) {
    auto oldest = cache_.begin();
    if (oldest->first == key) ++oldest;
    cache_.erase(oldest);
  }
}

void SampleSource::check_tokens(std::span<const std::int32_t> tokens,
                                std::int64_t global_index) const {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      throw DatasetError(out_of_vocabulary(tokens[i], "sample " + std::to_string(global_index)));
    }
  }
}

std::string SampleSource::out_of_vocabulary(std::int32_t token, const std::string& where) const {
  return dataset_->prefix() + ": " + where + " holds token " + std::to_string(token) + "; expected in [0, " +
         std::to_string(config_.vocab_size) +
         ") (the tokenizer's vocabulary); fix: name the tokenizer the dataset was built with "
         "(--tokenizer-type, docs/DATA.md section 13; without it the data must be the byte tokenizer's, "
         "258 ids) or rebuild the dataset with the matching tokenizer";
}

// Before training, the split's first sequences (up to config_.precheck_tokens tokens) are held to
// the vocabulary: data of another tokenizer than the run's is refused at once (every document of
// a Megatron dataset ends with its tokenizer's EOD), not at the first window that meets it.
void SampleSource::precheck_tokens() const {
  const std::int64_t kPrecheckTokens = config_.precheck_tokens;
  std::int64_t checked = 0;
  std::vector<std::int32_t> tokens;
  for (std::int64_t sequence = range_.begin; sequence < range_.end && checked < kPrecheckTokens; ++sequence) {
    tokens.resize(static_cast<std::size_t>(
        std::min<std::int64_t>(dataset_->sequence_length(sequence), kPrecheckTokens - checked)));
    dataset_->read_tokens(sequence, 0, tokens);
    for (const std::int32_t token : tokens) {
      if (token < 0 || token >= config_.vocab_size) {
        throw DatasetError(out_of_vocabulary(token, "sequence " + std::to_string(sequence)));
      }
    }
    checked += static_cast<std::int64_t>(tokens.size());
  }
}

void SampleSource::read_stream(std::int64_t stream_begin, std::span<std::int32_t> out) const {
  std::int64_t position = stream_begin;
  std::size_t filled = 0;
  while (filled < out.size()) {
    const std::int64_t epoch = position / tokens_per_epoch_;
    const std::int64_t offset = position % tokens_per_epoch_;
    const auto epoch_layout = layout(epoch);
    const auto& starts = epoch_layout->token_starts;
    // The last sequence starting at or before `offset`: zero-length sequences share their
    // successor's start, so this is the one that holds the token.
    const auto k = static_cast<std::size_t>(
        std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin() - 1);
    const std::int64_t sequence = epoch_layout->order[k];
    const std::int64_t within = offset - starts[k];
    const std::int64_t available = dataset_->sequence_length(sequence) - within;
    const auto take = static_cast<std::size_t>(
        std::min<std::int64_t>(available, static_cast<std::int64_t>(out.size() - filled)));
    dataset_->read_tokens(sequence, within, out.subspan(filled, take));
    filled += take;
    position += static_cast<std::int64_t>(take);
  }
}

std::int64_t SampleSource::first_sample_of_epoch(std::int64_t epoch) const {
  if (epoch < 0) throw std::invalid_argument("epoch " + std::to_string(epoch) + " < 0");
  if (config_.data.packing == Packing::concat) {
    return ceil_div(checked_multiply(epoch, tokens_per_epoch_, "epoch x tokens per epoch"),
                    config_.seq_length);
  }
  if (config_.data.data_order == DataOrder::sequential) {
    const auto windows = static_cast<std::int64_t>(layout(0)->window_starts.size()) - 1;
    return checked_multiply(epoch, windows, "epoch x windows per epoch");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (unit_epoch_starts_.empty()) unit_epoch_starts_.push_back(0);
  while (static_cast<std::int64_t>(unit_epoch_starts_.size()) <= epoch) {
    const auto next = static_cast<std::int64_t>(unit_epoch_starts_.size()) - 1;
    std::shared_ptr<const EpochLayout> built = build_layout(next);
    const auto windows = static_cast<std::int64_t>(built->window_starts.size()) - 1;
    if (!cache_.contains(next)) remember_locked(next, std::move(built));
    unit_epoch_starts_.push_back(unit_epoch_starts_.back() + windows);
  }
  return unit_epoch_starts_[static_cast<std::size_t>(epoch)];
}

std::int64_t SampleSource::samples_in_epoch(std::int64_t epoch) const {
  return first_sample_of_epoch(epoch + 1) - first_sample_of_epoch(epoch);
}

std::int64_t SampleSource::epoch_of_sample(std::int64_t global_index) const {
  if (global_index < 0) {
    throw std::invalid_argument("sample index " + std::to_string(global_index) + " < 0");
  }
  if (config_.data.packing == Packing::concat) {
    return checked_multiply(global_index, config_.seq_length, "sample x seq_length") /
           tokens_per_epoch_;
  }
  if (config_.data.data_order == DataOrder::sequential) {
    return global_index / samples_in_epoch(0);
  }
  std::int64_t epoch = 0;
  while (first_sample_of_epoch(epoch + 1) <= global_index) ++epoch;
  return epoch;
}

void SampleSource::read_unit_window(std::int64_t global_index, std::span<std::int32_t> out) const {
  const std::int64_t epoch = epoch_of_sample(global_index);
  const std::int64_t window = global_index - first_sample_of_epoch(epoch);
  const auto epoch_layout = layout(epoch);
  const auto first = static_cast<std::size_t>(epoch_layout->window_starts[static_cast<std::size_t>(window)]);
  const auto last = static_cast<std::size_t>(epoch_layout->window_starts[static_cast<std::size_t>(window) + 1]);
  std::size_t filled = 0;
  for (std::size_t p = first; p < last; ++p) {
    const Piece& piece = epoch_layout->pieces[p];
    const auto count = static_cast<std::size_t>(piece.token_count);
    dataset_->read_tokens(piece.sequence, piece.token_begin, out.subspan(filled, count));
    filled += count;
  }
  check_tokens(out.first(filled), global_index);
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(filled), out.end(), config_.pad_token);
}

void SampleSource::read_megatron_window(std::int64_t global_index, std::span<std::int32_t> out) const {
  // Megatron's sample i: the L+1 tokens from stream position shuffle[i] x L of its document
  // index's stream (megatron_order.hpp); the last window ends inside the stream by construction.
  std::int64_t position = megatron_->window_begin(global_index);
  const auto& documents = megatron_->document_index();
  std::size_t filled = 0;
  while (filled < out.size()) {
    const auto at = megatron_->place(position);
    const std::int64_t sequence = documents[at.entry];
    const std::int64_t available = dataset_->sequence_length(sequence) - at.offset;
    const auto take = static_cast<std::size_t>(
        std::min<std::int64_t>(available, static_cast<std::int64_t>(out.size() - filled)));
    dataset_->read_tokens(sequence, at.offset, out.subspan(filled, take));
    filled += take;
    position += static_cast<std::int64_t>(take);
  }
}

std::vector<std::int32_t> SampleSource::window_tokens(std::int64_t global_index) const {
  if (global_index < 0) {
    throw std::invalid_argument("sample index " + std::to_string(global_index) + " < 0");
  }
  std::vector<std::int32_t> window(static_cast<std::size_t>(config_.seq_length + 1));  // [seq+1]
  if (megatron_) {
    read_megatron_window(global_index, window);
    check_tokens(window, global_index);
  } else if (config_.data.packing == Packing::concat) {
    // SPEC 2: sample i covers stream tokens [i*L, i*L + L + 1).
    read_stream(checked_multiply(global_index, config_.seq_length, "sample x seq_length"), window);
    check_tokens(window, global_index);
  } else {
    read_unit_window(global_index, window);
  }
  return window;
}

Sample SampleSource::sample(std::int64_t global_index) const {
  const auto window = window_tokens(global_index);
  return build_sample(global_index, window, rules_);
}

// ---- Sample order over ranks ------------------------------------------------------------------

std::vector<std::int64_t> microbatch_sample_indices(const MicrobatchPosition& position) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("microbatch_sample_indices: " + message);
  };
  require(position.micro_batch_size >= 1,
          "micro_batch_size = " + std::to_string(position.micro_batch_size) + "; expected >= 1");
  require(position.data_parallel_size >= 1,
          "data_parallel_size = " + std::to_string(position.data_parallel_size) + "; expected >= 1");
  require(position.consumed_samples >= 0,
          "consumed_samples = " + std::to_string(position.consumed_samples) + "; expected >= 0");
  require(position.microbatch >= 0,
          "microbatch = " + std::to_string(position.microbatch) + "; expected >= 0");
  require(position.data_parallel_rank >= 0 &&
              position.data_parallel_rank < position.data_parallel_size,
          "data_parallel_rank = " + std::to_string(position.data_parallel_rank) +
              "; expected in [0, " + std::to_string(position.data_parallel_size) + ")");
  // SPEC 2: consumed + m*mbs*DP + r*mbs + [0, mbs).
  const std::int64_t first = position.consumed_samples +
                             position.microbatch * position.micro_batch_size *
                                 position.data_parallel_size +
                             position.data_parallel_rank * position.micro_batch_size;
  std::vector<std::int64_t> indices(static_cast<std::size_t>(position.micro_batch_size));
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = first + static_cast<std::int64_t>(i);
  return indices;
}

}  // namespace tandem::data
