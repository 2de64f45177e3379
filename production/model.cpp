// The production decoder's microbatch forward/backward (model.hpp), op by op against
// reference/model.cpp's forward_sample / backward_sample.
#include "production/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem::production {
namespace {

void require(bool holds, const std::string& message) {
  if (!holds) throw std::invalid_argument("production model: " + message);
}

}  // namespace

DecoderModel::DecoderModel(const ModelConfig& config, const ModelLayout& layout, Backend& backend,
                           const DecoderOptions& options)
    : config_(config),
      layout_(layout),
      backend_(backend),
      compute_(options.compute),
      micro_batch_size_(options.micro_batch_size),
      seq_(config.seq_length),
      rows_(options.micro_batch_size * config.seq_length) {
  const std::int64_t d = config.hidden_size;
  const std::int64_t query_width = config.num_attention_heads * config.head_dim();  // H*hd
  const std::int64_t kv_width = config.kv_width();                                  // G*hd
  const std::int64_t ffn = config.ffn_hidden_size;                                  // F
  const std::int64_t vocab = config.padded_vocab_size;                              // V
  const std::int64_t heads = config.num_attention_heads;
  const std::int64_t half = config.head_dim() / 2;
  epsilon_ = static_cast<float>(config.norm_epsilon);
  attention_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim())));  // SPEC 4
  const std::int64_t fitting = std::max<std::int64_t>(1, kLogitsChunkBytes / (vocab * 4));
  chunk_rows_ = std::min(rows_, options.logits_chunk_rows > 0 ? options.logits_chunk_rows : fitting);

  tokens_ = Buffer<std::int32_t>(backend, rows_);
  labels_ = Buffer<std::int32_t>(backend, rows_);
  loss_mask_ = Buffer<std::uint8_t>(backend, rows_);
  positions_ = Buffer<std::int32_t>(backend, rows_);
  attention_start_ = Buffer<std::int32_t>(backend, rows_);
  rope_cosines_ = Buffer<float>(backend, rows_ * half);
  rope_sines_ = Buffer<float>(backend, rows_ * half);
  blocks_.resize(static_cast<std::size_t>(config.num_layers));
  for (BlockActivations& block : blocks_) {
    block.block_input = ComputeBuffer(backend, compute_, rows_ * d);
    block.attn_inverse_rms = Buffer<float>(backend, rows_);
    block.attn_normed = ComputeBuffer(backend, compute_, rows_ * d);
    block.query = ComputeBuffer(backend, compute_, rows_ * query_width);
    block.key = ComputeBuffer(backend, compute_, rows_ * kv_width);
    block.value = ComputeBuffer(backend, compute_, rows_ * kv_width);
    block.context = ComputeBuffer(backend, compute_, rows_ * query_width);
    block.logsumexp = Buffer<float>(backend, rows_ * heads);
    block.mid = ComputeBuffer(backend, compute_, rows_ * d);
    block.mlp_inverse_rms = Buffer<float>(backend, rows_);
    block.mlp_normed = ComputeBuffer(backend, compute_, rows_ * d);
    block.gate = ComputeBuffer(backend, compute_, rows_ * ffn);
    block.up = ComputeBuffer(backend, compute_, rows_ * ffn);
    block.hidden = ComputeBuffer(backend, compute_, rows_ * ffn);
  }
  stream_ = ComputeBuffer(backend, compute_, rows_ * d);
  branch_ = ComputeBuffer(backend, compute_, rows_ * d);
  final_inverse_rms_ = Buffer<float>(backend, rows_);
  final_normed_ = ComputeBuffer(backend, compute_, rows_ * d);
  logits_ = Buffer<float>(backend, chunk_rows_ * vocab);
  if (compute_ != DType::f32) logits_grad_ = ComputeBuffer(backend, compute_, chunk_rows_ * vocab);
  stream_grad_ = ComputeBuffer(backend, compute_, rows_ * d);
  normed_grad_ = ComputeBuffer(backend, compute_, rows_ * d);
  context_grad_ = ComputeBuffer(backend, compute_, rows_ * query_width);
  query_grad_ = ComputeBuffer(backend, compute_, rows_ * query_width);
  key_grad_ = ComputeBuffer(backend, compute_, rows_ * kv_width);
  value_grad_ = ComputeBuffer(backend, compute_, rows_ * kv_width);
  hidden_grad_ = ComputeBuffer(backend, compute_, rows_ * ffn);
  gate_grad_ = ComputeBuffer(backend, compute_, rows_ * ffn);
  up_grad_ = ComputeBuffer(backend, compute_, rows_ * ffn);
}

const void* DecoderModel::weight_at(const void* weights, std::int64_t tensor_index) const {
  if (tensor_index < 0) return nullptr;
  return static_cast<const std::uint8_t*>(weights) +
         layout_.tensor(tensor_index).offset * dtype_bytes(compute_);
}

void DecoderModel::upload_inputs(const std::vector<Sample>& samples) {
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
  tokens_.upload(tokens);
  labels_.upload(labels);
  loss_mask_.upload(loss_mask);
  positions_.upload(positions);
  attention_start_.upload(starts);
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
                                   float* main_grads) {
  GemmParams data_grad;  // [rows, in] (+)= [rows, out] x [out, in]
  data_grad.m = rows_;
  data_grad.n = linear.in;
  data_grad.k = linear.out;
  data_grad.a = GemmOperand{output_grad, compute_, Transpose::no};
  data_grad.b = GemmOperand{weight_at(weights, linear.weight), compute_, Transpose::no};
  data_grad.c = input_grad;
  data_grad.c_dtype = compute_;
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

void DecoderModel::forward(const void* weights) {
  const std::int64_t d = config_.hidden_size;
  const std::int64_t hd = config_.head_dim();
  const std::int64_t heads = config_.num_attention_heads;
  const std::int64_t groups = config_.num_query_groups;
  const std::int64_t query_width = heads * hd;
  const std::int64_t kv_width = config_.kv_width();
  const std::int64_t ffn = config_.ffn_hidden_size;
  const AttentionShape attention{micro_batch_size_, seq_, heads, groups, hd};

  backend_.rope_table(RopeTableParams{positions_.data(), rope_cosines_.data(), rope_sines_.data(),
                                      rows_, hd, config_.rotary_base});
  before_weights(embedding_span());
  backend_.embedding_forward(EmbeddingForwardParams{tokens_.data(), weight_at(weights, layout_.embedding),
                                                    stream_.data(), rows_, d, compute_});

  for (std::size_t layer = 0; layer < blocks_.size(); ++layer) {
    const LayerTensorIndices& index = layout_.layers[layer];
    BlockActivations& block = blocks_[layer];
    before_weights(layer_span(layer));
    backend_.copy(block.block_input.data(), stream_.data(), rows_ * d * dtype_bytes(compute_));

    // RMSNorm -> attention -> residual add.
    backend_.rmsnorm_forward(RmsnormForwardParams{block.block_input.data(), weight_at(weights, index.input_norm),
                                                  block.attn_normed.data(), block.attn_inverse_rms.data(),
                                                  rows_, d, epsilon_, compute_});
    linear_forward(weights, Linear{index.q_weight, index.q_bias, d, query_width}, block.attn_normed.data(), block.query.data());
    linear_forward(weights, Linear{index.k_weight, index.k_bias, d, kv_width}, block.attn_normed.data(), block.key.data());
    linear_forward(weights, Linear{index.v_weight, index.v_bias, d, kv_width}, block.attn_normed.data(), block.value.data());
    backend_.rope_forward(RopeParams{block.query.data(), rope_cosines_.data(), rope_sines_.data(), rows_, heads, hd, compute_});
    backend_.rope_forward(RopeParams{block.key.data(), rope_cosines_.data(), rope_sines_.data(), rows_, groups, hd, compute_});
    AttentionForwardParams attend;
    attend.query = block.query.data();
    attend.key = block.key.data();
    attend.value = block.value.data();
    attend.attention_start = attention_start_.data();
    attend.context = block.context.data();
    attend.logsumexp = block.logsumexp.data();
    attend.shape = attention;
    attend.scale = attention_scale_;
    attend.dtype = compute_;
    backend_.attention_forward(attend);
    linear_forward(weights, Linear{index.o_weight, index.o_bias, query_width, d}, block.context.data(), branch_.data());
    backend_.add(AddParams{block.block_input.data(), branch_.data(), block.mid.data(), rows_ * d, compute_});

    // RMSNorm -> SwiGLU MLP -> residual add.
    backend_.rmsnorm_forward(RmsnormForwardParams{block.mid.data(), weight_at(weights, index.post_norm),
                                                  block.mlp_normed.data(), block.mlp_inverse_rms.data(),
                                                  rows_, d, epsilon_, compute_});
    linear_forward(weights, Linear{index.gate_weight, index.gate_bias, d, ffn}, block.mlp_normed.data(), block.gate.data());
    linear_forward(weights, Linear{index.up_weight, index.up_bias, d, ffn}, block.mlp_normed.data(), block.up.data());
    backend_.swiglu_forward(SwigluForwardParams{block.gate.data(), block.up.data(), block.hidden.data(), rows_ * ffn, compute_});
    linear_forward(weights, Linear{index.down_weight, index.down_bias, ffn, d}, block.hidden.data(), branch_.data());
    backend_.add(AddParams{block.mid.data(), branch_.data(), stream_.data(), rows_ * d, compute_});
  }

  before_weights(tail_span());
  backend_.rmsnorm_forward(RmsnormForwardParams{stream_.data(), weight_at(weights, layout_.final_norm),
                                                final_normed_.data(), final_inverse_rms_.data(), rows_,
                                                d, epsilon_, compute_});
}

void DecoderModel::loss_and_output_backward(const void* weights, float loss_scale,
                                            float* main_grads, float* row_losses) {
  const std::int64_t d = config_.hidden_size;
  const std::int64_t vocab = config_.padded_vocab_size;
  const void* output_weight = weight_at(weights, layout_.output);  // [V, d]
  // main_grads == nullptr: loss only (forward_loss); the kernel stores no gradient.
  const bool loss_only = main_grads == nullptr;
  void* logits_grad = loss_only                ? nullptr
                      : compute_ == DType::f32 ? static_cast<void*>(logits_.data())
                                               : logits_grad_.data();
  for (std::int64_t first = 0; first < rows_; first += chunk_rows_) {
    const std::int64_t chunk = std::min(chunk_rows_, rows_ - first);
    GemmParams logits;  // [chunk, V] fp32 = [chunk, d] x [V, d]^T
    logits.m = chunk;
    logits.n = vocab;
    logits.k = d;
    logits.a = GemmOperand{final_normed_.at(first * d), compute_, Transpose::no};
    logits.b = GemmOperand{output_weight, compute_, Transpose::yes};
    logits.c = logits_.data();
    logits.c_dtype = DType::f32;  // SPEC 5: logits in fp32 at least
    backend_.gemm(logits);

    CrossEntropyParams loss;
    loss.logits = logits_.data();
    loss.labels = labels_.at(first);
    loss.loss_mask = loss_mask_.at(first);
    loss.row_losses = row_losses + first;
    loss.logits_grad = logits_grad;
    loss.rows = chunk;
    loss.vocab = vocab;
    loss.loss_scale = loss_scale;
    loss.grad_dtype = compute_;
    backend_.cross_entropy(loss);
    if (loss_only) continue;

    GemmParams data_grad;  // [chunk, d] = [chunk, V] x [V, d]
    data_grad.m = chunk;
    data_grad.n = d;
    data_grad.k = vocab;
    data_grad.a = GemmOperand{logits_grad, compute_, Transpose::no};
    data_grad.b = GemmOperand{output_weight, compute_, Transpose::no};
    data_grad.c = normed_grad_.at(first * d);
    data_grad.c_dtype = compute_;
    backend_.gemm(data_grad);

    GemmParams weight_grad;  // [V, d] += [chunk, V]^T x [chunk, d]
    weight_grad.m = vocab;
    weight_grad.n = d;
    weight_grad.k = chunk;
    weight_grad.a = GemmOperand{logits_grad, compute_, Transpose::yes};
    weight_grad.b = GemmOperand{final_normed_.at(first * d), compute_, Transpose::no};
    weight_grad.c = main_grads + layout_.tensor(layout_.output).offset;
    weight_grad.c_dtype = DType::f32;
    weight_grad.beta = 1.0f;
    backend_.gemm(weight_grad);
  }
}

void DecoderModel::backward(const void* weights, float* main_grads) {
  const std::int64_t d = config_.hidden_size;
  const std::int64_t hd = config_.head_dim();
  const std::int64_t heads = config_.num_attention_heads;
  const std::int64_t groups = config_.num_query_groups;
  const std::int64_t query_width = heads * hd;
  const std::int64_t kv_width = config_.kv_width();
  const std::int64_t ffn = config_.ffn_hidden_size;
  const AttentionShape attention{micro_batch_size_, seq_, heads, groups, hd};
  auto rmsnorm_backward = [&](const void* input, std::int64_t weight, const float* inverse_rms,
                              bool accumulate) {
    RmsnormBackwardParams norm;
    norm.input = input;
    norm.weight = weight_at(weights, weight);
    norm.inverse_rms = inverse_rms;
    norm.output_grad = normed_grad_.data();
    norm.input_grad = stream_grad_.data();
    norm.weight_grad = main_grads + layout_.tensor(weight).offset;
    norm.rows = rows_;
    norm.width = d;
    norm.accumulate_input_grad = accumulate;
    norm.dtype = compute_;
    backend_.rmsnorm_backward(norm);
  };

  // Final norm: normed_grad holds the output projection's input gradient.
  rmsnorm_backward(stream_.data(), layout_.final_norm, final_inverse_rms_.data(), false);
  gradients_done(tail_span());  // the untied output projection's was added before

  for (std::size_t layer = blocks_.size(); layer-- > 0;) {
    const LayerTensorIndices& index = layout_.layers[layer];
    BlockActivations& block = blocks_[layer];

    // MLP branch: stream = mid + down(silu(gate) * up); stream_grad flows to mid unchanged.
    linear_backward(weights, Linear{index.down_weight, index.down_bias, ffn, d}, block.hidden.data(),
                    stream_grad_.data(), hidden_grad_.data(), false, main_grads);
    backend_.swiglu_backward(SwigluBackwardParams{block.gate.data(), block.up.data(), hidden_grad_.data(),
                                                  gate_grad_.data(), up_grad_.data(), rows_ * ffn, compute_});
    linear_backward(weights, Linear{index.gate_weight, index.gate_bias, d, ffn}, block.mlp_normed.data(),
                    gate_grad_.data(), normed_grad_.data(), false, main_grads);
    linear_backward(weights, Linear{index.up_weight, index.up_bias, d, ffn}, block.mlp_normed.data(),
                    up_grad_.data(), normed_grad_.data(), true, main_grads);
    rmsnorm_backward(block.mid.data(), index.post_norm, block.mlp_inverse_rms.data(), true);

    // Attention branch: mid = block_input + o(attention(rope(q), rope(k), v)).
    linear_backward(weights, Linear{index.o_weight, index.o_bias, query_width, d}, block.context.data(),
                    stream_grad_.data(), context_grad_.data(), false, main_grads);
    AttentionBackwardParams attend;
    attend.query = block.query.data();
    attend.key = block.key.data();
    attend.value = block.value.data();
    attend.context = block.context.data();
    attend.logsumexp = block.logsumexp.data();
    attend.context_grad = context_grad_.data();
    attend.attention_start = attention_start_.data();
    attend.query_grad = query_grad_.data();
    attend.key_grad = key_grad_.data();
    attend.value_grad = value_grad_.data();
    attend.shape = attention;
    attend.scale = attention_scale_;
    attend.dtype = compute_;
    backend_.attention_backward(attend);
    backend_.rope_backward(RopeParams{query_grad_.data(), rope_cosines_.data(), rope_sines_.data(), rows_, heads, hd, compute_});
    backend_.rope_backward(RopeParams{key_grad_.data(), rope_cosines_.data(), rope_sines_.data(), rows_, groups, hd, compute_});
    linear_backward(weights, Linear{index.q_weight, index.q_bias, d, query_width}, block.attn_normed.data(),
                    query_grad_.data(), normed_grad_.data(), false, main_grads);
    linear_backward(weights, Linear{index.k_weight, index.k_bias, d, kv_width}, block.attn_normed.data(),
                    key_grad_.data(), normed_grad_.data(), true, main_grads);
    linear_backward(weights, Linear{index.v_weight, index.v_bias, d, kv_width}, block.attn_normed.data(),
                    value_grad_.data(), normed_grad_.data(), true, main_grads);
    rmsnorm_backward(block.block_input.data(), index.input_norm, block.attn_inverse_rms.data(), true);
    gradients_done(layer_span(layer));
  }

  // Embedding (and, when tied, the same tensor as the output projection: SPEC 4).
  backend_.embedding_backward(EmbeddingBackwardParams{tokens_.data(), stream_grad_.data(),
                                                      main_grads + layout_.tensor(layout_.embedding).offset,
                                                      rows_, d, config_.padded_vocab_size, compute_});
  gradients_done(embedding_span());
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

void DecoderModel::forward_backward(const std::vector<Sample>& samples, const void* compute_weights,
                                    float loss_scale, float* main_grads, float* row_losses) {
  upload_inputs(samples);
  forward(compute_weights);
  loss_and_output_backward(compute_weights, loss_scale, main_grads, row_losses);
  backward(compute_weights, main_grads);
}

void DecoderModel::forward_loss(const std::vector<Sample>& samples, const void* compute_weights,
                                float* row_losses) {
  upload_inputs(samples);
  forward(compute_weights);
  loss_and_output_backward(compute_weights, 0.0f, nullptr, row_losses);
}

}  // namespace tandem::production
