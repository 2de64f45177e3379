// The reference decoder's forward and backward (reference/model.hpp), their template
// definitions, sample by sample, built from reference/model_ops.hpp. Boring on purpose;
// accumulates in `Real`. reference/model.cpp instantiates them for double and cpp_bin_float_50;
// equivalence/rounding_probe.cpp for its rounding probe.
#pragma once

#include "reference/model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "reference/model_ops.hpp"

namespace tandem::reference {

namespace {

// The model's sizes, named once.
struct Dimensions {
  std::int64_t width = 0;        // d
  std::int64_t heads = 0;        // H
  std::int64_t groups = 0;       // G
  std::int64_t head_dim = 0;     // hd = d / H
  std::int64_t query_width = 0;  // H * hd
  std::int64_t kv_width = 0;     // G * hd
  std::int64_t ffn = 0;          // F
  std::int64_t vocab = 0;        // padded vocabulary V
  std::int64_t layers = 0;       // L

  explicit Dimensions(const ModelConfig& config)
      : width(config.hidden_size),
        heads(config.num_attention_heads),
        groups(config.num_query_groups),
        head_dim(config.head_dim()),
        query_width(config.num_attention_heads * config.head_dim()),
        kv_width(config.kv_width()),
        ffn(config.ffn_hidden_size),
        vocab(config.padded_vocab_size),
        layers(config.num_layers) {}
};

template <class Real>
void resize(std::vector<Real>& buffer, std::int64_t elements) {
  buffer.assign(static_cast<std::size_t>(elements), Real(0));
}

// What the forward of one block keeps for its backward.
template <class Real>
struct BlockActivations {
  std::vector<Real> block_input;      // [seq, d] residual stream entering the block
  std::vector<Real> attn_inverse_rms; // [seq]
  std::vector<Real> attn_normed;      // [seq, d] input_layernorm output
  std::vector<Real> query;            // [seq, H*hd] after RoPE
  std::vector<Real> key;              // [seq, G*hd] after RoPE
  std::vector<Real> value;            // [seq, G*hd]
  std::vector<Real> probabilities;    // [H, seq, seq] attention weights on each span
  std::vector<Real> context;          // [seq, H*hd] attention output before o_proj
  std::vector<Real> mid;              // [seq, d] residual stream after the attention add
  std::vector<Real> mlp_inverse_rms;  // [seq]
  std::vector<Real> mlp_normed;       // [seq, d] post_attention_layernorm output
  std::vector<Real> gate;             // [seq, F] gate_proj output
  std::vector<Real> up;               // [seq, F] up_proj output
  std::vector<Real> hidden;           // [seq, F] silu(gate) * up
};

// How many values Workspace::prepare allocates (model.hpp's workspace_values); prepare checks
// itself against it.
inline std::int64_t counted_workspace_values(const Dimensions& dims, std::int64_t seq) {
  const std::int64_t per_block = 4 * seq * dims.width + 2 * seq + 2 * seq * dims.query_width +
                                 2 * seq * dims.kv_width + dims.heads * seq * seq + 3 * seq * dims.ffn;
  return 2 * (seq * dims.head_dim / 2) + dims.layers * per_block + 5 * seq * dims.width + seq +
         2 * seq * dims.vocab + 2 * seq * dims.query_width + 2 * seq * dims.kv_width + 3 * seq * dims.ffn;
}

// Every activation of one sample, and the scratch its backward needs; reused across samples.
template <class Real>
struct Workspace {
  std::int64_t seq = -1;
  std::vector<Real> rope_cosines;        // [seq, hd/2]
  std::vector<Real> rope_sines;          // [seq, hd/2]
  std::vector<BlockActivations<Real>> blocks;  // [L]
  std::vector<Real> stream;              // [seq, d] residual stream (ends as the final norm's input)
  std::vector<Real> branch_output;       // [seq, d] o_proj or down_proj output before the add
  std::vector<Real> final_inverse_rms;   // [seq]
  std::vector<Real> final_normed;        // [seq, d]
  std::vector<Real> logits;              // [seq, V]
  // Backward scratch.
  std::vector<Real> logits_grad;         // [seq, V]
  std::vector<Real> stream_grad;         // [seq, d] gradient of the residual stream
  std::vector<Real> normed_grad;         // [seq, d]
  std::vector<Real> context_grad;        // [seq, H*hd]
  std::vector<Real> query_grad;          // [seq, H*hd]
  std::vector<Real> key_grad;            // [seq, G*hd]
  std::vector<Real> value_grad;          // [seq, G*hd]
  std::vector<Real> hidden_grad;         // [seq, F]
  std::vector<Real> gate_grad;           // [seq, F]
  std::vector<Real> up_grad;             // [seq, F]

  void prepare(const Dimensions& dims, std::int64_t sequence_length) {
    if (sequence_length == seq) return;
    seq = sequence_length;
    resize(rope_cosines, seq * dims.head_dim / 2);
    resize(rope_sines, seq * dims.head_dim / 2);
    blocks.assign(static_cast<std::size_t>(dims.layers), BlockActivations<Real>{});
    for (BlockActivations<Real>& block : blocks) {
      resize(block.block_input, seq * dims.width);
      resize(block.attn_inverse_rms, seq);
      resize(block.attn_normed, seq * dims.width);
      resize(block.query, seq * dims.query_width);
      resize(block.key, seq * dims.kv_width);
      resize(block.value, seq * dims.kv_width);
      resize(block.probabilities, dims.heads * seq * seq);
      resize(block.context, seq * dims.query_width);
      resize(block.mid, seq * dims.width);
      resize(block.mlp_inverse_rms, seq);
      resize(block.mlp_normed, seq * dims.width);
      resize(block.gate, seq * dims.ffn);
      resize(block.up, seq * dims.ffn);
      resize(block.hidden, seq * dims.ffn);
    }
    resize(stream, seq * dims.width);
    resize(branch_output, seq * dims.width);
    resize(final_inverse_rms, seq);
    resize(final_normed, seq * dims.width);
    resize(logits, seq * dims.vocab);
    resize(logits_grad, seq * dims.vocab);
    resize(stream_grad, seq * dims.width);
    resize(normed_grad, seq * dims.width);
    resize(context_grad, seq * dims.query_width);
    resize(query_grad, seq * dims.query_width);
    resize(key_grad, seq * dims.kv_width);
    resize(value_grad, seq * dims.kv_width);
    resize(hidden_grad, seq * dims.ffn);
    resize(gate_grad, seq * dims.ffn);
    resize(up_grad, seq * dims.ffn);
    if (held_values() != counted_workspace_values(dims, seq)) {
      throw std::logic_error("reference Workspace: counted_workspace_values disagrees with prepare");
    }
  }

  std::int64_t held_values() const {
    std::int64_t values = 0;
    for (const BlockActivations<Real>& block : blocks) {
      for (const std::vector<Real>* buffer :
           {&block.block_input, &block.attn_inverse_rms, &block.attn_normed, &block.query, &block.key,
            &block.value, &block.probabilities, &block.context, &block.mid, &block.mlp_inverse_rms,
            &block.mlp_normed, &block.gate, &block.up, &block.hidden}) {
        values += static_cast<std::int64_t>(buffer->size());
      }
    }
    for (const std::vector<Real>* buffer :
         {&rope_cosines, &rope_sines, &stream, &branch_output, &final_inverse_rms, &final_normed, &logits,
          &logits_grad, &stream_grad, &normed_grad, &context_grad, &query_grad, &key_grad, &value_grad,
          &hidden_grad, &gate_grad, &up_grad}) {
      values += static_cast<std::int64_t>(buffer->size());
    }
    return values;
  }
};

template <class Real>
void fill_zero(std::vector<Real>& buffer) {
  std::fill(buffer.begin(), buffer.end(), Real(0));
}

// A tensor's first element in a flat buffer, or null for an absent tensor (a disabled bias).
template <class Real>
Real* tensor_in(std::vector<Real>& flat, const ModelLayout& layout, std::int64_t index) {
  return index < 0 ? nullptr : flat.data() + layout.tensor(index).offset;
}
template <class Real>
const Real* tensor_in(const std::vector<Real>& flat, const ModelLayout& layout, std::int64_t index) {
  return index < 0 ? nullptr : flat.data() + layout.tensor(index).offset;
}

constexpr const char* kModelName = "reference model";  // prefixes its input errors

void require(bool holds, const std::string& message) {
  if (!holds) throw std::invalid_argument(std::string(kModelName) + ": " + message);
}

template <class Real>
void validate_buffers(const ModelConfig& config, const ModelLayout& layout,
                      const std::vector<Real>& params) {
  require(layout.total_elements == make_model_layout(config).total_elements,
          "the layout does not belong to this configuration");
  require(static_cast<std::int64_t>(params.size()) == layout.total_elements,
          "params has " + std::to_string(params.size()) + " elements, the layout " +
              std::to_string(layout.total_elements));
}

// The forward of one sample (SPEC 4), keeping what the backward needs in `work`.
template <class Real>
void forward_sample(const ModelConfig& config, const ModelLayout& layout,
                    const std::vector<Real>& params, const Sample& sample, Workspace<Real>& work) {
  const Dimensions dims(config);
  const std::int64_t seq = static_cast<std::int64_t>(sample.tokens.size());
  work.prepare(dims, seq);
  const Real epsilon = Real(config.norm_epsilon);  // the double --norm-epsilon, widened exactly
  const AttentionShape attention{seq, dims.heads, dims.groups, dims.head_dim};

  rope_tables(sample.positions.data(), seq, dims.head_dim, Real(config.rotary_base),
              work.rope_cosines.data(), work.rope_sines.data());

  // Token embedding: row `token` of model.embed_tokens.weight [V, d].
  const Real* embedding = tensor_in(params, layout, layout.embedding);  // [V, d]
  for (std::int64_t t = 0; t < seq; ++t) {
    const Real* row = embedding + static_cast<std::int64_t>(sample.tokens[t]) * dims.width;  // [d]
    std::copy(row, row + dims.width, work.stream.begin() + t * dims.width);
  }

  for (std::int64_t layer = 0; layer < dims.layers; ++layer) {
    const LayerTensorIndices& index = layout.layers[static_cast<std::size_t>(layer)];
    BlockActivations<Real>& block = work.blocks[static_cast<std::size_t>(layer)];
    block.block_input = work.stream;

    // RMSNorm -> attention -> residual add.
    rmsnorm_forward(block.block_input.data(), tensor_in(params, layout, index.input_norm), seq,
                    dims.width, epsilon, block.attn_normed.data(), block.attn_inverse_rms.data());
    linear_forward(block.attn_normed.data(), tensor_in(params, layout, index.q_weight),
                   tensor_in(params, layout, index.q_bias), seq, dims.width, dims.query_width,
                   block.query.data());
    linear_forward(block.attn_normed.data(), tensor_in(params, layout, index.k_weight),
                   tensor_in(params, layout, index.k_bias), seq, dims.width, dims.kv_width,
                   block.key.data());
    linear_forward(block.attn_normed.data(), tensor_in(params, layout, index.v_weight),
                   tensor_in(params, layout, index.v_bias), seq, dims.width, dims.kv_width,
                   block.value.data());
    rope_forward(block.query.data(), work.rope_cosines.data(), work.rope_sines.data(), seq,
                 dims.heads, dims.head_dim);
    rope_forward(block.key.data(), work.rope_cosines.data(), work.rope_sines.data(), seq,
                 dims.groups, dims.head_dim);
    attention_forward(block.query.data(), block.key.data(), block.value.data(),
                      sample.attention_start.data(), attention, block.probabilities.data(),
                      block.context.data());
    linear_forward(block.context.data(), tensor_in(params, layout, index.o_weight),
                   tensor_in(params, layout, index.o_bias), seq, dims.query_width, dims.width,
                   work.branch_output.data());
    for (std::int64_t i = 0; i < seq * dims.width; ++i) {
      block.mid[static_cast<std::size_t>(i)] =
          block.block_input[static_cast<std::size_t>(i)] + work.branch_output[static_cast<std::size_t>(i)];
    }

    // RMSNorm -> SwiGLU MLP -> residual add.
    rmsnorm_forward(block.mid.data(), tensor_in(params, layout, index.post_norm), seq, dims.width,
                    epsilon, block.mlp_normed.data(), block.mlp_inverse_rms.data());
    linear_forward(block.mlp_normed.data(), tensor_in(params, layout, index.gate_weight),
                   tensor_in(params, layout, index.gate_bias), seq, dims.width, dims.ffn,
                   block.gate.data());
    linear_forward(block.mlp_normed.data(), tensor_in(params, layout, index.up_weight),
                   tensor_in(params, layout, index.up_bias), seq, dims.width, dims.ffn,
                   block.up.data());
    swiglu_forward(block.gate.data(), block.up.data(), seq * dims.ffn, block.hidden.data());
    linear_forward(block.hidden.data(), tensor_in(params, layout, index.down_weight),
                   tensor_in(params, layout, index.down_bias), seq, dims.ffn, dims.width,
                   work.branch_output.data());
    for (std::int64_t i = 0; i < seq * dims.width; ++i) {
      work.stream[static_cast<std::size_t>(i)] =
          block.mid[static_cast<std::size_t>(i)] + work.branch_output[static_cast<std::size_t>(i)];
    }
  }

  // Final RMSNorm -> output projection (lm_head, or the embedding when tied; no bias).
  rmsnorm_forward(work.stream.data(), tensor_in(params, layout, layout.final_norm), seq, dims.width,
                  epsilon, work.final_normed.data(), work.final_inverse_rms.data());
  linear_forward(work.final_normed.data(), tensor_in(params, layout, layout.output),
                 static_cast<const Real*>(nullptr), seq, dims.width, dims.vocab, work.logits.data());
}

// The backward of one sample given the forward's `work` and the logits' gradient in
// work.logits_grad; adds every parameter's gradient into `grads`.
template <class Real>
void backward_sample(const ModelConfig& config, const ModelLayout& layout,
                     const std::vector<Real>& params, const Sample& sample, Workspace<Real>& work,
                     std::vector<Real>& grads) {
  const Dimensions dims(config);
  const std::int64_t seq = work.seq;
  const AttentionShape attention{seq, dims.heads, dims.groups, dims.head_dim};

  // Output projection and final norm. stream_grad is the gradient of the residual stream.
  fill_zero(work.normed_grad);
  linear_backward(work.final_normed.data(), tensor_in(params, layout, layout.output),
                  work.logits_grad.data(), seq, dims.width, dims.vocab, work.normed_grad.data(),
                  tensor_in(grads, layout, layout.output), static_cast<Real*>(nullptr));
  fill_zero(work.stream_grad);
  rmsnorm_backward(work.stream.data(), tensor_in(params, layout, layout.final_norm),
                   work.final_inverse_rms.data(), work.normed_grad.data(), seq, dims.width,
                   work.stream_grad.data(), tensor_in(grads, layout, layout.final_norm));

  for (std::int64_t layer = dims.layers - 1; layer >= 0; --layer) {
    const LayerTensorIndices& index = layout.layers[static_cast<std::size_t>(layer)];
    BlockActivations<Real>& block = work.blocks[static_cast<std::size_t>(layer)];

    // MLP branch: stream = mid + down(silu(gate) * up). stream_grad flows to mid unchanged and
    // through the branch; the branch's contribution is added to it below.
    fill_zero(work.hidden_grad);
    linear_backward(block.hidden.data(), tensor_in(params, layout, index.down_weight),
                    work.stream_grad.data(), seq, dims.ffn, dims.width, work.hidden_grad.data(),
                    tensor_in(grads, layout, index.down_weight), tensor_in(grads, layout, index.down_bias));
    fill_zero(work.gate_grad);
    fill_zero(work.up_grad);
    swiglu_backward(block.gate.data(), block.up.data(), work.hidden_grad.data(), seq * dims.ffn,
                    work.gate_grad.data(), work.up_grad.data());
    fill_zero(work.normed_grad);
    linear_backward(block.mlp_normed.data(), tensor_in(params, layout, index.gate_weight),
                    work.gate_grad.data(), seq, dims.width, dims.ffn, work.normed_grad.data(),
                    tensor_in(grads, layout, index.gate_weight), tensor_in(grads, layout, index.gate_bias));
    linear_backward(block.mlp_normed.data(), tensor_in(params, layout, index.up_weight),
                    work.up_grad.data(), seq, dims.width, dims.ffn, work.normed_grad.data(),
                    tensor_in(grads, layout, index.up_weight), tensor_in(grads, layout, index.up_bias));
    rmsnorm_backward(block.mid.data(), tensor_in(params, layout, index.post_norm),
                     block.mlp_inverse_rms.data(), work.normed_grad.data(), seq, dims.width,
                     work.stream_grad.data(), tensor_in(grads, layout, index.post_norm));

    // Attention branch: mid = block_input + o(attention(rope(q), rope(k), v)).
    fill_zero(work.context_grad);
    linear_backward(block.context.data(), tensor_in(params, layout, index.o_weight),
                    work.stream_grad.data(), seq, dims.query_width, dims.width,
                    work.context_grad.data(), tensor_in(grads, layout, index.o_weight),
                    tensor_in(grads, layout, index.o_bias));
    fill_zero(work.query_grad);
    fill_zero(work.key_grad);
    fill_zero(work.value_grad);
    attention_backward(block.query.data(), block.key.data(), block.value.data(),
                       sample.attention_start.data(), attention, block.probabilities.data(),
                       work.context_grad.data(), work.query_grad.data(), work.key_grad.data(),
                       work.value_grad.data());
    rope_backward(work.query_grad.data(), work.rope_cosines.data(), work.rope_sines.data(), seq,
                  dims.heads, dims.head_dim);
    rope_backward(work.key_grad.data(), work.rope_cosines.data(), work.rope_sines.data(), seq,
                  dims.groups, dims.head_dim);
    fill_zero(work.normed_grad);
    linear_backward(block.attn_normed.data(), tensor_in(params, layout, index.q_weight),
                    work.query_grad.data(), seq, dims.width, dims.query_width, work.normed_grad.data(),
                    tensor_in(grads, layout, index.q_weight), tensor_in(grads, layout, index.q_bias));
    linear_backward(block.attn_normed.data(), tensor_in(params, layout, index.k_weight),
                    work.key_grad.data(), seq, dims.width, dims.kv_width, work.normed_grad.data(),
                    tensor_in(grads, layout, index.k_weight), tensor_in(grads, layout, index.k_bias));
    linear_backward(block.attn_normed.data(), tensor_in(params, layout, index.v_weight),
                    work.value_grad.data(), seq, dims.width, dims.kv_width, work.normed_grad.data(),
                    tensor_in(grads, layout, index.v_weight), tensor_in(grads, layout, index.v_bias));
    rmsnorm_backward(block.block_input.data(), tensor_in(params, layout, index.input_norm),
                     block.attn_inverse_rms.data(), work.normed_grad.data(), seq, dims.width,
                     work.stream_grad.data(), tensor_in(grads, layout, index.input_norm));
  }

  // Embedding: each position's stream gradient goes to its token's row (and, when tied, adds
  // to the output projection's gradient already in the same tensor: SPEC 4).
  Real* embedding_grad = tensor_in(grads, layout, layout.embedding);  // [V, d]
  for (std::int64_t t = 0; t < seq; ++t) {
    Real* row = embedding_grad + static_cast<std::int64_t>(sample.tokens[t]) * dims.width;  // [d]
    const Real* upstream = work.stream_grad.data() + t * dims.width;                          // [d]
    for (std::int64_t j = 0; j < dims.width; ++j) row[j] += upstream[j];
  }
}

std::int64_t count_loss_tokens(const Sample& sample) {
  std::int64_t loss_tokens = 0;
  for (std::uint8_t mask : sample.loss_mask) loss_tokens += mask;
  return loss_tokens;
}

}  // namespace

template <class Real>
LossAndCounts<Real> forward_backward(const ModelConfig& config, const ModelLayout& layout,
                                     const std::vector<Real>& params,
                                     const std::vector<Sample>& samples, const Real& loss_scale,
                                     std::vector<Real>& grads) {
  validate_buffers(config, layout, params);
  require(grads.size() == params.size(), "grads has " + std::to_string(grads.size()) +
                                             " elements, params " + std::to_string(params.size()));
  for (const Sample& sample : samples) {
    validate_sample(sample, config.padded_vocab_size, std::nullopt, kModelName);
  }
  const Dimensions dims(config);
  Workspace<Real> work;
  LossAndCounts<Real> result;
  for (const Sample& sample : samples) {
    forward_sample(config, layout, params, sample, work);
    fill_zero(work.logits_grad);
    const Real sample_loss = cross_entropy_forward_backward(
        work.logits.data(), sample.labels.data(), sample.loss_mask.data(), work.seq, dims.vocab,
        loss_scale, work.logits_grad.data());
    add_to_loss_sum(result.masked_loss_sum, sample_loss);
    result.loss_tokens += count_loss_tokens(sample);
    backward_sample(config, layout, params, sample, work, grads);
  }
  return result;
}

template <class Real>
LossAndCounts<Real> forward_loss(const ModelConfig& config, const ModelLayout& layout,
                                 const std::vector<Real>& params,
                                 const std::vector<Sample>& samples) {
  validate_buffers(config, layout, params);
  for (const Sample& sample : samples) {
    validate_sample(sample, config.padded_vocab_size, std::nullopt, kModelName);
  }
  const Dimensions dims(config);
  Workspace<Real> work;
  LossAndCounts<Real> result;
  for (const Sample& sample : samples) {
    forward_sample(config, layout, params, sample, work);
    const Real sample_loss = cross_entropy_forward_backward(
        work.logits.data(), sample.labels.data(), sample.loss_mask.data(), work.seq, dims.vocab,
        Real(0), static_cast<Real*>(nullptr));
    add_to_loss_sum(result.masked_loss_sum, sample_loss);
    result.loss_tokens += count_loss_tokens(sample);
  }
  return result;
}

template <class Real>
std::vector<Real> forward_logits(const ModelConfig& config, const ModelLayout& layout,
                                 const std::vector<Real>& params, const Sample& sample) {
  validate_buffers(config, layout, params);
  validate_sample(sample, config.padded_vocab_size, std::nullopt, kModelName);
  Workspace<Real> work;
  forward_sample(config, layout, params, sample, work);
  return work.logits;
}

#define TANDEM_INSTANTIATE_REFERENCE_MODEL(Real)                                                   \
  template LossAndCounts<Real> forward_backward<Real>(const ModelConfig&, const ModelLayout&,      \
                                                      const std::vector<Real>&,                    \
                                                      const std::vector<Sample>&, const Real&,     \
                                                      std::vector<Real>&);                         \
  template LossAndCounts<Real> forward_loss<Real>(const ModelConfig&, const ModelLayout&,          \
                                                  const std::vector<Real>&,                        \
                                                  const std::vector<Sample>&);                     \
  template std::vector<Real> forward_logits<Real>(const ModelConfig&, const ModelLayout&,          \
                                                  const std::vector<Real>&, const Sample&);

}  // namespace tandem::reference
