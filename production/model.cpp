// The production decoder's microbatch forward/backward (model.hpp), op by op against
// reference/model.cpp's forward_sample / backward_sample. The output projection and the loss
// are in model_loss.cpp.
#include "production/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

void require(bool holds, const std::string& message) {
  if (!holds) throw std::invalid_argument("production model: " + message);
}

}  // namespace

DecoderModel::DecoderModel(const ModelConfig& config, const ModelLayout& layout, Backend& backend,
                           const DecoderOptions& options)
    : config_(config),
      pipeline_(options.pipeline),
      stage_(options.pipeline_stage),
      tp_(options.tensor_parallel_comm),
      sequence_parallel_(options.sequence_parallel && options.tensor_parallel_comm != nullptr &&
                         options.tensor_parallel_comm->size() > 1),
      step_hooks_(options.hooks),
      layout_(layout),
      backend_(backend),
      compute_(options.compute),
      micro_batch_size_(options.micro_batch_size),
      seq_(config.seq_length),
      rows_(options.micro_batch_size * config.seq_length) {
  const std::int64_t d = config.hidden_size;
  const std::int64_t hd = config.head_dim();
  const TensorParallelLayout* split = options.tensor_parallel;
  require((split == nullptr) == (tp_ == nullptr), "a tensor-parallel layout needs its exchanges, and back");
  require(pipeline_ == nullptr || (stage_ >= 0 && stage_ < pipeline_->pipeline_size() &&
                                   pipeline_->split().num_layers == config.num_layers),
          "the pipeline stage is not one of the stages' (stage or layers)");
  require(options.activation_slots >= 1 && options.chunk_slots >= 1, "at least one activation and one chunk slot");
  heads_ = split ? split->heads() : config.num_attention_heads;
  groups_ = split ? split->groups() : config.num_query_groups;
  ffn_ = split ? split->ffn() : config.ffn_hidden_size;
  vocab_ = split ? split->vocab_rows() : config.padded_vocab_size;
  vocab_begin_ = split ? split->vocab_begin() : 0;
  const std::int64_t ranks = tp_ ? tp_->size() : 1;
  require(!sequence_parallel_ || rows_ % ranks == 0,
          "--sequence-parallel splits the microbatch's " + std::to_string(rows_) + " positions over " +
              std::to_string(ranks) + " TP ranks; fix: a --seq-length divisible by --tensor-model-parallel-size");
  stream_rows_ = sequence_parallel_ ? rows_ / ranks : rows_;
  const std::int64_t query_width = heads_ * hd;  // H*hd
  const std::int64_t kv_width = groups_ * hd;    // G*hd
  const std::int64_t ffn = ffn_;                 // F
  const std::int64_t vocab = vocab_;             // V
  const std::int64_t heads = heads_;
  const std::int64_t half = hd / 2;
  const std::int64_t stream = stream_rows_;
  epsilon_ = static_cast<Real>(config.norm_epsilon);
  attention_scale_ = static_cast<Real>(1.0 / std::sqrt(static_cast<double>(config.head_dim())));  // SPEC 4
  chunk_rows_ = options.logits_chunk_rows > 0 ? std::min(rows_, options.logits_chunk_rows)
                                              : default_logits_chunk_rows(rows_, vocab);

  // Counts what the model allocates (allocated_bytes()).
  auto compute_buffer = [&](std::int64_t size) {
    allocated_bytes_ += size * dtype_bytes(compute_);
    return ComputeBuffer(backend, compute_, size);
  };
  auto buffer = [&]<class T>(std::int64_t size, T) {
    allocated_bytes_ += size * static_cast<std::int64_t>(sizeof(T));
    return Buffer<T>(backend, size);
  };
  slots_.resize(static_cast<std::size_t>(options.activation_slots));
  for (ActivationSlot& slot : slots_) {
    slot.tokens = buffer(rows_, std::int32_t{});
    slot.labels = buffer(rows_, std::int32_t{});
    slot.loss_mask = buffer(rows_, std::uint8_t{});
    slot.positions = buffer(rows_, std::int32_t{});
    slot.attention_start = buffer(rows_, std::int32_t{});
    slot.rope_cosines = buffer(rows_ * half, Real{});
    slot.rope_sines = buffer(rows_ * half, Real{});
  }
  auto whole_block = [&](BlockActivations& block) {
    block.block_input = compute_buffer(stream * d);
    block.attn_inverse_rms = buffer(stream, Real{});
    block.attn_normed = compute_buffer(stream * d);
    block.query = compute_buffer(rows_ * query_width);
    block.key = compute_buffer(rows_ * kv_width);
    block.value = compute_buffer(rows_ * kv_width);
    block.context = compute_buffer(rows_ * query_width);
    block.logsumexp = buffer(rows_ * heads, Real{});
    block.mid = compute_buffer(stream * d);
    block.mlp_inverse_rms = buffer(stream, Real{});
    block.mlp_normed = compute_buffer(stream * d);
    block.gate = compute_buffer(rows_ * ffn);
    block.up = compute_buffer(rows_ * ffn);
    block.hidden = compute_buffer(rows_ * ffn);
  };
  // Per chunk slot, the largest chunk's layers: everything, or (full recompute) only a group's
  // input on its first layer; the scratch for the largest group.
  recompute_ = options.recompute;
  require(recompute_.granularity != RecomputeGranularity::full || recompute_.num_layers >= 1,
          "full recomputation needs at least one layer per group (--recompute-num-layers)");
  std::int64_t largest_group = 0;
  std::int64_t largest_chunk = 0;
  for (std::int64_t chunk = 0; chunk < chunks(); ++chunk) {
    const LayerRange layers = chunk_layers(chunk);
    largest_group = std::max(largest_group, recompute_.largest_group(layers.size()));
    largest_chunk = std::max(largest_chunk, layers.size());
  }
  chunk_slots_.resize(static_cast<std::size_t>(options.chunk_slots));
  for (ChunkSlot& slot : chunk_slots_) {
    slot.blocks.resize(static_cast<std::size_t>(largest_chunk));
    for (std::int64_t local = 0; local < largest_chunk; ++local) {
      BlockActivations& block = slot.blocks[static_cast<std::size_t>(local)];
      if (!recompute_.recomputes(local)) {
        whole_block(block);
      } else if (recompute_.group_begin(local) == local) {
        block.block_input = compute_buffer(stream * d);
      }
    }
  }
  recomputed_.resize(static_cast<std::size_t>(largest_group));
  for (BlockActivations& block : recomputed_) whole_block(block);
  stream_ = compute_buffer(stream * d);
  branch_ = compute_buffer(stream * d);
  final_inverse_rms_ = buffer(stream, Real{});
  final_normed_ = compute_buffer(stream * d);
  logits_ = buffer(chunk_rows_ * vocab, Real{});
  if (compute_ != DType::f32) logits_grad_ = compute_buffer(chunk_rows_ * vocab);
  if (tensor_parallel()) {
    if (sequence_parallel_) {
      gathered_ = compute_buffer(rows_ * d);
      reduced_ = buffer(stream * d, Real{});
    }
    embedded_ = compute_buffer(rows_ * d);
    partial_ = buffer(rows_ * d, Real{});
    ce_maxima_ = buffer(ranks * chunk_rows_, Real{});
    ce_normalizers_ = buffer(ranks * chunk_rows_, Real{});
    ce_targets_ = buffer(ranks * chunk_rows_, Real{});
    ce_row_stats_ = buffer(chunk_rows_, Real{});
    ce_row_targets_ = buffer(chunk_rows_, Real{});
  }
  stream_grad_ = compute_buffer(stream * d);
  normed_grad_ = compute_buffer(stream * d);
  context_grad_ = compute_buffer(rows_ * query_width);
  query_grad_ = compute_buffer(rows_ * query_width);
  key_grad_ = compute_buffer(rows_ * kv_width);
  value_grad_ = compute_buffer(rows_ * kv_width);
  hidden_grad_ = compute_buffer(rows_ * ffn);
  gate_grad_ = compute_buffer(rows_ * ffn);
  up_grad_ = compute_buffer(rows_ * ffn);
}

namespace {

std::int64_t block_bytes(const BlockActivations& block) {
  std::int64_t bytes = 0;
  for (const ComputeBuffer* buffer : {&block.block_input, &block.attn_normed, &block.query, &block.key, &block.value,
                                      &block.context, &block.mid, &block.mlp_normed, &block.gate, &block.up,
                                      &block.hidden}) {
    bytes += buffer->size() * dtype_bytes(buffer->dtype());
  }
  for (const Buffer<Real>* buffer : {&block.attn_inverse_rms, &block.logsumexp, &block.mlp_inverse_rms}) {
    bytes += buffer->bytes();
  }
  return bytes;
}

}  // namespace

std::int64_t DecoderModel::activation_bytes_per_layer() const {
  // A whole block: a stored layer's, or the recompute scratch's (every layer recomputed).
  auto whole = [](const BlockActivations& block) { return block.query.size() > 0; };
  const std::vector<BlockActivations>& blocks = chunk_slots_.front().blocks;
  if (const auto held = std::find_if(blocks.begin(), blocks.end(), whole); held != blocks.end()) {
    return block_bytes(*held);
  }
  return recomputed_.empty() ? 0 : block_bytes(recomputed_.front());
}

std::int64_t DecoderModel::stored_activation_bytes() const {
  std::int64_t bytes = 0;
  for (const ChunkSlot& slot : chunk_slots_) {
    for (const BlockActivations& block : slot.blocks) bytes += block_bytes(block);
  }
  for (const BlockActivations& block : recomputed_) bytes += block_bytes(block);
  return bytes;
}

const void* DecoderModel::weight_at(const void* weights, std::int64_t tensor_index) const {
  if (tensor_index < 0) return nullptr;
  return static_cast<const std::uint8_t*>(weights) +
         layout_.tensor(tensor_index).offset * dtype_bytes(compute_);
}

std::int64_t DecoderModel::stream_bytes() const {
  return stream_rows_ * config_.hidden_size * dtype_bytes(compute_);
}

void DecoderModel::use_slot(std::int64_t slot) {
  require(slot >= 0 && slot < activation_slots(),
          "activation slot " + std::to_string(slot) + " of " + std::to_string(activation_slots()));
  slot_ = slot;
}

void DecoderModel::use_chunk_slot(std::int64_t chunk_slot) {
  require(chunk_slot >= 0 && chunk_slot < chunk_slots(),
          "chunk slot " + std::to_string(chunk_slot) + " of " + std::to_string(chunk_slots()));
  chunk_slot_ = chunk_slot;
}

BlockActivations& DecoderModel::stored(std::int64_t chunk, std::size_t layer) {
  const auto local = static_cast<std::size_t>(static_cast<std::int64_t>(layer) - chunk_layers(chunk).begin);
  return chunk_slots_[static_cast<std::size_t>(chunk_slot_)].blocks[local];
}

void DecoderModel::begin_microbatch(const std::vector<Sample>& samples, std::int64_t slot) {
  use_slot(slot);
  require(static_cast<std::int64_t>(samples.size()) == micro_batch_size_,
          std::to_string(samples.size()) + " samples for a microbatch of " +
              std::to_string(micro_batch_size_) + " (--micro-batch-size)");
  std::vector<std::int32_t> tokens, labels, positions, starts;  // [rows] each
  std::vector<std::uint8_t> loss_mask;                          // [rows]
  for (const Sample& sample : samples) {
    validate_sample(sample, config_.padded_vocab_size, seq_, "production model");
    tokens.insert(tokens.end(), sample.tokens.begin(), sample.tokens.end());
    labels.insert(labels.end(), sample.labels.begin(), sample.labels.end());
    loss_mask.insert(loss_mask.end(), sample.loss_mask.begin(), sample.loss_mask.end());
    positions.insert(positions.end(), sample.positions.begin(), sample.positions.end());
    starts.insert(starts.end(), sample.attention_start.begin(), sample.attention_start.end());
  }
  ActivationSlot& inputs = current();
  inputs.tokens.upload(tokens);
  inputs.labels.upload(labels);
  inputs.loss_mask.upload(loss_mask);
  inputs.positions.upload(positions);
  inputs.attention_start.upload(starts);
  backend_.rope_table(RopeTableParams{inputs.positions.data(), inputs.rope_cosines.data(), inputs.rope_sines.data(),
                                      rows_, config_.head_dim(), config_.rotary_base});
}

void DecoderModel::linear_forward(const void* weights, const Linear& linear, const void* input,
                                  void* output) {
  GemmParams gemm;  // [rows, out] = [rows, in] x [out, in]^T
  gemm.m = rows_;
  gemm.n = linear.out;
  gemm.k = linear.in;
  gemm.a = GemmOperand{input, compute_, Transpose::no};
  gemm.b = GemmOperand{weight_at(weights, linear.weight), compute_, Transpose::yes};
  gemm.c = output;
  gemm.c_dtype = compute_;
  backend_.gemm(gemm);
  if (linear.bias >= 0) {
    backend_.bias_add(BiasAddParams{output, weight_at(weights, linear.bias), rows_, linear.out, compute_});
  }
}

void DecoderModel::linear_backward(const void* weights, const Linear& linear, const void* input,
                                   const void* output_grad, void* input_grad, bool accumulate,
                                   Real* main_grads, DType input_grad_dtype) {
  GemmParams data_grad;  // [rows, in] (+)= [rows, out] x [out, in]
  data_grad.m = rows_;
  data_grad.n = linear.in;
  data_grad.k = linear.out;
  data_grad.a = GemmOperand{output_grad, compute_, Transpose::no};
  data_grad.b = GemmOperand{weight_at(weights, linear.weight), compute_, Transpose::no};
  data_grad.c = input_grad;
  data_grad.c_dtype = input_grad_dtype;
  data_grad.beta = accumulate ? 1.0f : 0.0f;
  backend_.gemm(data_grad);

  GemmParams weight_grad;  // [out, in] += [rows, out]^T x [rows, in], fp32 main gradient
  weight_grad.m = linear.out;
  weight_grad.n = linear.in;
  weight_grad.k = rows_;
  weight_grad.a = GemmOperand{output_grad, compute_, Transpose::yes};
  weight_grad.b = GemmOperand{input, compute_, Transpose::no};
  weight_grad.c = main_grads + layout_.tensor(linear.weight).offset;
  weight_grad.c_dtype = DType::f32;
  weight_grad.beta = 1.0f;
  backend_.gemm(weight_grad);
  if (linear.bias >= 0) {
    backend_.bias_grad(BiasGradParams{output_grad, main_grads + layout_.tensor(linear.bias).offset,
                                      rows_, linear.out, compute_});
  }
}

const void* DecoderModel::whole_rows(const void* stream_part) {
  if (!sequence_parallel_) return stream_part;
  const std::int64_t d = config_.hidden_size;
  tp_->all_gather(stream_part, gathered_.data(), stream_rows_ * d * dtype_bytes(compute_));
  return gathered_.data();
}

// `sums` is 1 but for StepHooks::row_parallel_sums' negative controls (0: this rank's own part of
// the sum; 2: the sum summed again).
void DecoderModel::reduce_partial_into(void* output, int sums) {
  const std::int64_t d = config_.hidden_size;
  for (int extra = 1; extra < sums; ++extra) tp_->all_reduce(partial_.data(), rows_ * d);
  if (sums == 0) {
    const std::int64_t first = sequence_parallel_ ? tp_->rank() * stream_rows_ * d : 0;
    backend_.convert(ConvertParams{partial_.at(first), output, stream_rows_ * d, DType::f32, compute_});
    return;
  }
  if (sequence_parallel_) {
    tp_->reduce_scatter(partial_.data(), reduced_.data(), rows_ * d);
    backend_.convert(ConvertParams{reduced_.data(), output, stream_rows_ * d, DType::f32, compute_});
  } else {
    tp_->all_reduce(partial_.data(), rows_ * d);
    backend_.convert(ConvertParams{partial_.data(), output, rows_ * d, DType::f32, compute_});
  }
}

void DecoderModel::row_parallel_forward(const void* weights, const Linear& linear, const void* input, void* output) {
  if (!tensor_parallel()) return linear_forward(weights, linear, input, output);
  GemmParams gemm;  // [rows, out] fp32 partial = [rows, in / TP] x [out, in / TP]^T
  gemm.m = rows_;
  gemm.n = linear.out;
  gemm.k = linear.in;
  gemm.a = GemmOperand{input, compute_, Transpose::no};
  gemm.b = GemmOperand{weight_at(weights, linear.weight), compute_, Transpose::yes};
  gemm.c = partial_.data();
  gemm.c_dtype = DType::f32;
  backend_.gemm(gemm);
  reduce_partial_into(output, step_hooks_ ? step_hooks_->row_parallel_sums() : 1);  // StepHooks point
  if (linear.bias >= 0) {  // replicated: added once, after the sum
    backend_.bias_add(BiasAddParams{output, weight_at(weights, linear.bias), stream_rows_, linear.out, compute_});
  }
}

void DecoderModel::embed(const void* weights) {
  const std::int64_t d = config_.hidden_size;
  const void* table = weight_at(weights, layout_.embedding);
  if (!tensor_parallel()) {
    backend_.embedding_forward(EmbeddingForwardParams{current().tokens.data(), table, stream_.data(), rows_, d, compute_});
    return;
  }
  // This rank's vocabulary rows (zeros for the others' tokens); the sum over TP is exact (one
  // term per position is not zero).
  EmbeddingForwardParams lookup{current().tokens.data(), table, embedded_.data(), rows_, d, compute_};
  lookup.vocab_begin = vocab_begin_;
  lookup.vocab_rows = vocab_;
  backend_.embedding_forward(lookup);
  backend_.convert(ConvertParams{embedded_.data(), partial_.data(), rows_ * d, compute_, DType::f32});
  reduce_partial_into(stream_.data());
}

void DecoderModel::layer_forward(const void* weights, std::size_t layer, BlockActivations& block, bool announce) {
  const std::int64_t d = config_.hidden_size;
  const std::int64_t hd = config_.head_dim();
  const std::int64_t heads = heads_;
  const std::int64_t groups = groups_;
  const std::int64_t query_width = heads * hd;
  const std::int64_t kv_width = groups * hd;
  const std::int64_t ffn = ffn_;
  const std::int64_t stream = stream_rows_;
  const AttentionShape attention{micro_batch_size_, seq_, heads, groups, hd};
  const LayerTensorIndices& index = layout_.layers[layer];
  if (announce) before_weights(layer_span(layer));
  backend_.copy(block.block_input.data(), stream_.data(), stream * d * dtype_bytes(compute_));

  // RMSNorm -> attention -> residual add.
  backend_.rmsnorm_forward(RmsnormForwardParams{block.block_input.data(), weight_at(weights, index.input_norm),
                                                block.attn_normed.data(), block.attn_inverse_rms.data(),
                                                stream, d, epsilon_, compute_});
  const void* attention_input = whole_rows(block.attn_normed.data());  // [rows, d]
  linear_forward(weights, Linear{index.q_weight, index.q_bias, d, query_width}, attention_input, block.query.data());
  linear_forward(weights, Linear{index.k_weight, index.k_bias, d, kv_width}, attention_input, block.key.data());
  linear_forward(weights, Linear{index.v_weight, index.v_bias, d, kv_width}, attention_input, block.value.data());
  backend_.rope_forward(RopeParams{block.query.data(), current().rope_cosines.data(), current().rope_sines.data(), rows_, heads, hd, compute_});
  backend_.rope_forward(RopeParams{block.key.data(), current().rope_cosines.data(), current().rope_sines.data(), rows_, groups, hd, compute_});
  AttentionForwardParams attend;
  attend.query = block.query.data();
  attend.key = block.key.data();
  attend.value = block.value.data();
  attend.attention_start = current().attention_start.data();
  attend.context = block.context.data();
  attend.logsumexp = block.logsumexp.data();
  attend.shape = attention;
  attend.scale = attention_scale_;
  attend.dtype = compute_;
  backend_.attention_forward(attend);
  row_parallel_forward(weights, Linear{index.o_weight, index.o_bias, query_width, d}, block.context.data(), branch_.data());
  backend_.add(AddParams{block.block_input.data(), branch_.data(), block.mid.data(), stream * d, compute_});

  // RMSNorm -> SwiGLU MLP -> residual add.
  backend_.rmsnorm_forward(RmsnormForwardParams{block.mid.data(), weight_at(weights, index.post_norm),
                                                block.mlp_normed.data(), block.mlp_inverse_rms.data(),
                                                stream, d, epsilon_, compute_});
  const void* mlp_input = whole_rows(block.mlp_normed.data());  // [rows, d]
  linear_forward(weights, Linear{index.gate_weight, index.gate_bias, d, ffn}, mlp_input, block.gate.data());
  linear_forward(weights, Linear{index.up_weight, index.up_bias, d, ffn}, mlp_input, block.up.data());
  backend_.swiglu_forward(SwigluForwardParams{block.gate.data(), block.up.data(), block.hidden.data(), rows_ * ffn, compute_});
  row_parallel_forward(weights, Linear{index.down_weight, index.down_bias, ffn, d}, block.hidden.data(), branch_.data());
  backend_.add(AddParams{block.mid.data(), branch_.data(), stream_.data(), stream * d, compute_});
}

bool DecoderModel::recomputed(std::int64_t chunk, std::size_t layer) const {
  return recompute_.recomputes(static_cast<std::int64_t>(layer) - chunk_layers(chunk).begin);
}

BlockActivations& DecoderModel::activations_of(std::int64_t chunk, std::size_t layer) {
  if (!recomputed(chunk, layer)) return stored(chunk, layer);
  const std::int64_t local = static_cast<std::int64_t>(layer) - chunk_layers(chunk).begin;
  return recomputed_[static_cast<std::size_t>(local - recompute_.group_begin(local))];
}

void DecoderModel::recompute_group(const void* weights, std::int64_t chunk, std::size_t layer) {
  const std::int64_t begin = chunk_layers(chunk).begin;
  const std::int64_t local = static_cast<std::int64_t>(layer) - begin;
  const auto first = static_cast<std::size_t>(begin + recompute_.group_begin(local));
  // stream_ is free in backward: the final norm's backward has read it, the trainer has sent it.
  backend_.copy(stream_.data(), stored(chunk, first).block_input.data(), stream_bytes());
  for (std::size_t rerun = first; rerun <= layer; ++rerun) {
    layer_forward(weights, rerun, activations_of(chunk, rerun), false);
  }
}

void DecoderModel::forward_chunk(const void* weights, std::int64_t slot, std::int64_t chunk, std::int64_t chunk_slot) {
  use_slot(slot);
  use_chunk_slot(chunk_slot);
  if (starts_model(chunk)) {
    before_weights(embedding_span());
    embed(weights);
  }
  const LayerRange layers = chunk_layers(chunk);
  for (auto layer = static_cast<std::size_t>(layers.begin); layer < static_cast<std::size_t>(layers.end); ++layer) {
    const std::int64_t local = static_cast<std::int64_t>(layer) - layers.begin;
    if (recomputed(chunk, layer) && recompute_.group_begin(local) == local) {  // the group's input, kept
      backend_.copy(stored(chunk, layer).block_input.data(), stream_.data(), stream_bytes());
    }
    layer_forward(weights, layer, activations_of(chunk, layer), true);
  }
  if (!ends_model(chunk)) return;
  // The last stage of tied embeddings reads its copy of the embedding as the output layer.
  if (!starts_model(0)) before_weights(embedding_span());
  before_weights(tail_span());
  backend_.rmsnorm_forward(RmsnormForwardParams{stream_.data(), weight_at(weights, layout_.final_norm),
                                                 final_normed_.data(), final_inverse_rms_.data(), stream_rows_,
                                                 config_.hidden_size, epsilon_, compute_});
}

void DecoderModel::backward_chunk(const void* weights, std::int64_t slot, std::int64_t chunk, std::int64_t chunk_slot,
                                  Real loss_scale, Real* main_grads, Real* row_losses) {
  use_slot(slot);
  use_chunk_slot(chunk_slot);
  const std::int64_t d = config_.hidden_size;
  const std::int64_t hd = config_.head_dim();
  const std::int64_t heads = heads_;
  const std::int64_t groups = groups_;
  const std::int64_t query_width = heads * hd;
  const std::int64_t kv_width = groups * hd;
  const std::int64_t ffn = ffn_;
  const std::int64_t stream = stream_rows_;
  const bool tp = tensor_parallel();
  const AttentionShape attention{micro_batch_size_, seq_, heads, groups, hd};
  auto rmsnorm_backward = [&](const void* input, std::int64_t weight, const Real* inverse_rms,
                              bool accumulate) {
    RmsnormBackwardParams norm;
    norm.input = input;
    norm.weight = weight_at(weights, weight);
    norm.inverse_rms = inverse_rms;
    norm.output_grad = normed_grad_.data();
    norm.input_grad = stream_grad_.data();
    norm.weight_grad = main_grads + layout_.tensor(weight).offset;
    norm.rows = stream;
    norm.width = d;
    norm.accumulate_input_grad = accumulate;
    norm.dtype = compute_;
    backend_.rmsnorm_backward(norm);
  };
  // A row-parallel layer's backward: the output gradient's whole rows (gathered with SP) for the
  // input and weight gradients; a replicated bias's gradient from this rank's stream rows (partial
  // with SP, summed over TP by the trainer).
  auto row_parallel_backward = [&](const Linear& linear, const void* input, void* input_grad) {
    if (!tp) {
      linear_backward(weights, linear, input, stream_grad_.data(), input_grad, false, main_grads);
      return;
    }
    const Linear weight_only{linear.weight, -1, linear.in, linear.out};
    linear_backward(weights, weight_only, input, whole_rows(stream_grad_.data()), input_grad, false, main_grads);
    if (linear.bias >= 0) {
      backend_.bias_grad(BiasGradParams{stream_grad_.data(), main_grads + layout_.tensor(linear.bias).offset,
                                        stream, linear.out, compute_});
    }
  };
  // Column-parallel layers sharing one input (q, k, v; gate, up): their input gradients summed
  // into normed_grad_ (with TP: in the fp32 partial, then over TP) and their weight gradients.
  struct ColumnGrad {
    Linear linear;
    const void* output_grad;
  };
  auto column_parallel_backward = [&](const void* stream_input, std::initializer_list<ColumnGrad> layers) {
    const void* input = tp ? whole_rows(stream_input) : stream_input;  // [rows, d]
    bool accumulate = false;
    for (const ColumnGrad& layer : layers) {
      if (tp) {
        linear_backward(weights, layer.linear, input, layer.output_grad, partial_.data(), accumulate, main_grads,
                        DType::f32);
      } else {
        linear_backward(weights, layer.linear, input, layer.output_grad, normed_grad_.data(), accumulate, main_grads);
      }
      accumulate = true;
    }
    if (tp) reduce_partial_into(normed_grad_.data());
  };

  if (ends_model(chunk)) {
    loss_and_output_backward(weights, loss_scale, main_grads, row_losses);
    // Final norm: normed_grad holds the output projection's input gradient.
    rmsnorm_backward(stream_.data(), layout_.final_norm, final_inverse_rms_.data(), false);
    gradients_done(tail_span());  // the untied output projection's was added before
    if (!starts_model(0)) gradients_done(embedding_span());  // the last stage's tied copy: complete
  }
  for (auto layer = static_cast<std::size_t>(chunk_layers(chunk).end);
       layer-- > static_cast<std::size_t>(chunk_layers(chunk).begin);) {
    const LayerTensorIndices& index = layout_.layers[layer];
    const std::int64_t local = static_cast<std::int64_t>(layer) - chunk_layers(chunk).begin;
    // Backward meets a recomputed group at its last layer: the group's forward again, from its input.
    if (recomputed(chunk, layer) && local + 1 == recompute_.group_end(local, chunk_layers(chunk).size())) {
      recompute_group(weights, chunk, layer);
    }
    BlockActivations& block = activations_of(chunk, layer);

    // MLP branch: stream = mid + down(silu(gate) * up); stream_grad flows to mid unchanged.
    row_parallel_backward(Linear{index.down_weight, index.down_bias, ffn, d}, block.hidden.data(), hidden_grad_.data());
    backend_.swiglu_backward(SwigluBackwardParams{block.gate.data(), block.up.data(), hidden_grad_.data(),
                                                  gate_grad_.data(), up_grad_.data(), rows_ * ffn, compute_});
    column_parallel_backward(block.mlp_normed.data(),
                             {ColumnGrad{Linear{index.gate_weight, index.gate_bias, d, ffn}, gate_grad_.data()},
                              ColumnGrad{Linear{index.up_weight, index.up_bias, d, ffn}, up_grad_.data()}});
    rmsnorm_backward(block.mid.data(), index.post_norm, block.mlp_inverse_rms.data(), true);

    // Attention branch: mid = block_input + o(attention(rope(q), rope(k), v)).
    row_parallel_backward(Linear{index.o_weight, index.o_bias, query_width, d}, block.context.data(), context_grad_.data());
    AttentionBackwardParams attend;
    attend.query = block.query.data();
    attend.key = block.key.data();
    attend.value = block.value.data();
    attend.context = block.context.data();
    attend.logsumexp = block.logsumexp.data();
    attend.context_grad = context_grad_.data();
    attend.attention_start = current().attention_start.data();
    attend.query_grad = query_grad_.data();
    attend.key_grad = key_grad_.data();
    attend.value_grad = value_grad_.data();
    attend.shape = attention;
    attend.scale = attention_scale_;
    attend.dtype = compute_;
    backend_.attention_backward(attend);
    backend_.rope_backward(RopeParams{query_grad_.data(), current().rope_cosines.data(), current().rope_sines.data(), rows_, heads, hd, compute_});
    backend_.rope_backward(RopeParams{key_grad_.data(), current().rope_cosines.data(), current().rope_sines.data(), rows_, groups, hd, compute_});
    column_parallel_backward(block.attn_normed.data(),
                             {ColumnGrad{Linear{index.q_weight, index.q_bias, d, query_width}, query_grad_.data()},
                              ColumnGrad{Linear{index.k_weight, index.k_bias, d, kv_width}, key_grad_.data()},
                              ColumnGrad{Linear{index.v_weight, index.v_bias, d, kv_width}, value_grad_.data()}});
    rmsnorm_backward(block.block_input.data(), index.input_norm, block.attn_inverse_rms.data(), true);
    gradients_done(layer_span(layer));
  }
  if (!starts_model(chunk)) return;
  // Embedding (and, when tied, the same tensor as the output projection: SPEC 4); with TP this
  // rank's vocabulary rows, from the whole rows of the stream's gradient.
  EmbeddingBackwardParams embedding{current().tokens.data(), whole_rows(stream_grad_.data()),
                                    main_grads + layout_.tensor(layout_.embedding).offset,
                                    rows_, d, vocab_, compute_};
  embedding.vocab_begin = vocab_begin_;
  backend_.embedding_backward(embedding);
  gradients_done(embedding_span());
}

LayerRange DecoderModel::chunk_layers(std::int64_t chunk) const {
  return pipeline_ ? pipeline_->layers(stage_, chunk) : LayerRange{0, config_.num_layers};
}

bool DecoderModel::starts_model(std::int64_t chunk) const {
  return pipeline_ == nullptr || PipelineStages::holds_embedding(stage_, chunk);
}

bool DecoderModel::ends_model(std::int64_t chunk) const {
  return pipeline_ == nullptr || pipeline_->holds_output(stage_, chunk);
}

DecoderModel::FlatSpan DecoderModel::embedding_span() const {
  const ParameterTensor& embedding = layout_.tensor(layout_.embedding);
  return {embedding.offset, embedding.offset + embedding.numel};
}

// A layer's tensors are consecutive in the flat buffer (core/model_layout.hpp), from its input
// norm to the next layer's input norm, or to the final norm after the last layer.
DecoderModel::FlatSpan DecoderModel::layer_span(std::size_t layer) const {
  const std::int64_t begin = layout_.tensor(layout_.layers[layer].input_norm).offset;
  const std::int64_t end = layer + 1 < layout_.layers.size()
                               ? layout_.tensor(layout_.layers[layer + 1].input_norm).offset
                               : layout_.tensor(layout_.final_norm).offset;
  return {begin, end};
}

DecoderModel::FlatSpan DecoderModel::tail_span() const {
  return {layout_.tensor(layout_.final_norm).offset, layout_.total_elements};
}

}  // namespace tandem::production
