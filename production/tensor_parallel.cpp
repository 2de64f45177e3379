// The tensor-parallel split (tensor_parallel.hpp).
#include "production/tensor_parallel.hpp"

#include <stdexcept>
#include <string>

#include "core/init.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

void require_divisible(std::int64_t value, int size, const std::string& field) {
  if (value % size != 0) {
    throw std::invalid_argument("tensor parallelism: " + field + " = " + std::to_string(value) +
                                " is not divisible by --tensor-model-parallel-size (" + std::to_string(size) +
                                "); Megatron splits it evenly over the TP ranks; fix: choose a multiple of TP");
  }
}

}  // namespace

TensorParallelLayout::TensorParallelLayout(const ModelConfig& config, int size, int rank)
    : TensorParallelLayout(config, size, rank, PipelineStages(PipelineSplit{config.num_layers, 1, 1}), 0) {}

TensorParallelLayout::TensorParallelLayout(const ModelConfig& config, int size, int rank,
                                           const PipelineStages& stages, std::int64_t stage)
    : size_(size), rank_(rank), stage_(stage), pipeline_size_(stages.pipeline_size()),
      full_(make_model_layout(config)) {
  if (stages.split().num_layers != config.num_layers || stage < 0 || stage >= stages.pipeline_size()) {
    throw std::invalid_argument("pipeline parallelism: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages.pipeline_size()) + " stages of " +
                                std::to_string(stages.split().num_layers) + " layers, for a model of " +
                                std::to_string(config.num_layers));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("tensor parallelism: rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  require_divisible(config.num_attention_heads, size, "--num-attention-heads");
  require_divisible(config.ffn_hidden_size, size, "--ffn-hidden-size");
  require_divisible(config.padded_vocab_size, size, "the padded vocabulary");
  const std::int64_t groups = config.num_query_groups;
  if (groups % size != 0 && size % groups != 0) {
    throw std::invalid_argument("tensor parallelism: --num-query-groups = " + std::to_string(groups) +
                                " and --tensor-model-parallel-size = " + std::to_string(size) +
                                ": one must divide the other (Megatron); fix: choose G a multiple or a divisor of TP");
  }
  const std::int64_t hd = config.head_dim();
  heads_ = config.num_attention_heads / size;
  // G >= TP: G/TP groups a rank. G < TP: TP/G ranks share each group, each holding its key/value
  // rows whole (Megatron 0.19 replicates them); the rank's heads all lie in group rank / (TP/G).
  kv_sharing_ = groups >= size ? 1 : size / static_cast<int>(groups);
  groups_ = groups >= size ? groups / size : 1;
  const std::int64_t first_group = groups >= size ? rank * groups_ : rank / kv_sharing_;
  kv_group_begin_ = first_group;
  ffn_ = config.ffn_hidden_size / size;
  vocab_rows_ = config.padded_vocab_size / size;
  vocab_begin_ = rank * vocab_rows_;

  // Each tensor's split and the width of one rank's part along it.
  std::vector<TensorSplit> splits(full_.tensors.size(), TensorSplit::replicated);
  std::vector<std::int64_t> part(full_.tensors.size(), 0);
  std::vector<std::int64_t> first_row(full_.tensors.size(), -1);  // -1: rank x width
  auto split = [&](std::int64_t tensor, TensorSplit how, std::int64_t width, std::int64_t begin = -1) {
    if (tensor < 0) return;
    splits[static_cast<std::size_t>(tensor)] = how;
    part[static_cast<std::size_t>(tensor)] = width;
    first_row[static_cast<std::size_t>(tensor)] = begin;
  };
  split(full_.embedding, TensorSplit::rows, vocab_rows_);
  split(full_.output, TensorSplit::rows, vocab_rows_);
  for (const LayerTensorIndices& layer : full_.layers) {
    split(layer.q_weight, TensorSplit::rows, heads_ * hd);
    split(layer.q_bias, TensorSplit::rows, heads_ * hd);
    for (const std::int64_t kv : {layer.k_weight, layer.k_bias, layer.v_weight, layer.v_bias}) {
      split(kv, TensorSplit::rows, groups_ * hd, first_group * hd);
      if (kv >= 0 && kv_sharing_ > 1) kv_shared_.push_back(kv);
    }
    split(layer.o_weight, TensorSplit::columns, heads_ * hd);
    split(layer.gate_weight, TensorSplit::rows, ffn_);
    split(layer.gate_bias, TensorSplit::rows, ffn_);
    split(layer.up_weight, TensorSplit::rows, ffn_);
    split(layer.up_bias, TensorSplit::rows, ffn_);
    split(layer.down_weight, TensorSplit::columns, ffn_);
  }

  // The tensors of this pipeline stage (the class comment).
  const bool first_stage = stage == 0;
  const bool last_stage = stage == stages.pipeline_size() - 1;
  std::vector<bool> held(full_.tensors.size(), false);
  const auto hold = [&held](std::int64_t tensor) {
    if (tensor >= 0) held[static_cast<std::size_t>(tensor)] = true;
  };
  if (first_stage) hold(full_.embedding);
  if (last_stage) {
    hold(full_.final_norm);
    hold(full_.output);  // the embedding itself when tied
  }
  tied_copy_ = last_stage && !first_stage && full_.output == full_.embedding;
  for (std::int64_t chunk = 0; chunk < stages.virtual_stages(); ++chunk) {
    const LayerRange range = stages.layers(stage, chunk);
    for (std::int64_t layer = range.begin; layer < range.end; ++layer) {
      const LayerTensorIndices& tensors = full_.layers[static_cast<std::size_t>(layer)];
      for (const std::int64_t tensor :
           {tensors.input_norm, tensors.q_weight, tensors.q_bias, tensors.k_weight, tensors.k_bias, tensors.v_weight,
            tensors.v_bias, tensors.o_weight, tensors.o_bias, tensors.post_norm, tensors.gate_weight, tensors.gate_bias,
            tensors.up_weight, tensors.up_bias, tensors.down_weight, tensors.down_bias}) {
        hold(tensor);
      }
    }
  }

  local_ = full_;
  local_.total_elements = 0;
  for (std::size_t i = 0; i < full_.tensors.size(); ++i) {
    const ParameterTensor& tensor = full_.tensors[i];
    TensorShard shard;
    shard.split = splits[i];
    shard.full_rows = tensor.shape.front();
    shard.full_columns = tensor.shape.size() > 1 ? tensor.shape[1] : 1;
    shard.rows = shard.full_rows;
    shard.columns = shard.full_columns;
    ParameterTensor& mine = local_.tensors[i];
    if (shard.split == TensorSplit::rows) {
      shard.row_begin = first_row[i] >= 0 ? first_row[i] : rank * part[i];
      shard.rows = part[i];
      mine.shape.front() = part[i];
    } else if (shard.split == TensorSplit::columns) {
      shard.column_begin = rank * part[i];
      shard.columns = part[i];
      mine.shape[1] = part[i];
    }
    if (!held[i]) {  // another stage's: no elements here
      shard.rows = 0;
      mine.shape.front() = 0;
    }
    mine.numel = shard.rows * shard.columns;
    mine.offset = local_.total_elements;
    local_.total_elements += mine.numel;
    shards_.push_back(shard);
  }
}

std::vector<FlatRange> TensorParallelLayout::full_ranges(const FlatRange& local) const {
  std::vector<FlatRange> out;
  const auto push = [&out](std::int64_t begin, std::int64_t count) {
    if (count <= 0) return;
    if (!out.empty() && out.back().begin + out.back().count == begin) {
      out.back().count += count;
    } else {
      out.push_back(FlatRange{begin, count});
    }
  };
  const std::int64_t end = local.begin + local.count;
  for (std::size_t i = 0; i < local_.tensors.size(); ++i) {
    const ParameterTensor& mine = local_.tensors[i];
    const std::int64_t first = std::max(local.begin, mine.offset);
    const std::int64_t last = std::min(end, mine.offset + mine.numel);
    if (first >= last) continue;
    const TensorShard& shard = shards_[i];
    const std::int64_t full_offset = full_.tensors[i].offset;
    if (shard.split != TensorSplit::columns) {  // whole rows: one contiguous run
      push(full_offset + shard.row_begin * shard.full_columns + (first - mine.offset), last - first);
      continue;
    }
    for (std::int64_t element = first - mine.offset; element < last - mine.offset;) {
      const std::int64_t row = element / shard.columns;
      const std::int64_t column = element % shard.columns;
      const std::int64_t run = std::min(shard.columns - column, last - mine.offset - element);
      push(full_offset + (shard.row_begin + row) * shard.full_columns + shard.column_begin + column, run);
      element += run;
    }
  }
  return out;
}

std::int64_t TensorParallelLayout::local_index(std::int64_t full) const {
  for (std::size_t i = 0; i < full_.tensors.size(); ++i) {
    const ParameterTensor& whole = full_.tensors[i];
    if (full < whole.offset || full >= whole.offset + whole.numel) continue;
    const TensorShard& shard = shards_[i];
    const std::int64_t row = (full - whole.offset) / shard.full_columns - shard.row_begin;
    const std::int64_t column = (full - whole.offset) % shard.full_columns - shard.column_begin;
    if (row < 0 || row >= shard.rows || column < 0 || column >= shard.columns) return -1;
    return local_.tensors[i].offset + row * shard.columns + column;
  }
  return -1;
}

std::vector<FlatRange> TensorParallelLayout::tied_embedding_ranges() const {
  if (pipeline_size_ == 1 || full_.output != full_.embedding || !holds(full_.embedding)) return {};
  const ParameterTensor& mine = local_.tensors[static_cast<std::size_t>(full_.embedding)];
  return {FlatRange{mine.offset, mine.numel}};
}

std::vector<FlatRange> TensorParallelLayout::replicated_ranges() const {
  std::vector<FlatRange> out;
  for (std::size_t i = 0; i < local_.tensors.size(); ++i) {
    if (shards_[i].split != TensorSplit::replicated || local_.tensors[i].numel == 0) continue;
    const ParameterTensor& mine = local_.tensors[i];
    if (!out.empty() && out.back().begin + out.back().count == mine.offset) {
      out.back().count += mine.numel;
    } else {
      out.push_back(FlatRange{mine.offset, mine.numel});
    }
  }
  return out;
}

std::vector<FlatRange> TensorParallelLayout::kv_shared_ranges() const {
  std::vector<FlatRange> out;
  for (const std::int64_t tensor : kv_shared_) {
    const ParameterTensor& mine = local_.tensors[static_cast<std::size_t>(tensor)];
    if (mine.numel == 0) continue;  // another pipeline stage's layer
    if (!out.empty() && out.back().begin + out.back().count == mine.offset) {
      out.back().count += mine.numel;
    } else {
      out.push_back(FlatRange{mine.offset, mine.numel});
    }
  }
  return out;
}

std::vector<Real> TensorParallelLayout::initial_parameters(const ModelConfig& config, std::uint64_t seed) const {
  std::vector<Real> out(static_cast<std::size_t>(local_.total_elements));
  for (std::size_t i = 0; i < local_.tensors.size(); ++i) {
    const ParameterTensor& mine = local_.tensors[i];
    const ParameterTensor& whole = full_.tensors[i];
    auto next = out.begin() + static_cast<std::ptrdiff_t>(mine.offset);  // full_ranges keeps local order
    for (const FlatRange& range : full_ranges(FlatRange{mine.offset, mine.numel})) {
      for (std::int64_t flat = range.begin; flat < range.begin + range.count; ++flat) {
        *next++ = initial_value(whole, config.init_method_std, seed, flat - whole.offset);
      }
    }
  }
  return out;
}

}  // namespace tandem::production
