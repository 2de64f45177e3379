// The per-element gradient and loss bounds of one update (error_bounds.hpp): the reference
// decoder's forward and backward (reference/model.cpp's order, in double, from
// reference/model_ops.hpp's values) with error_ops.hpp's bound beside every activation.
#include "equivalence/error_bounds.hpp"

#include <algorithm>
#include <cmath>

#include "core/data/packing.hpp"
#include "core/model_layout.hpp"
#include "equivalence/error_ops.hpp"
#include "reference/model_ops.hpp"

namespace tandem::equivalence {
namespace {

using error_ops::Rounding;

// reference/audit.cpp: first-order bounds doubled to cover products of two roundings.
constexpr double kSecondOrderMargin = 2.0;

// A reference activation and the bound on its error, element by element.
struct Bounded {
  std::vector<double> value;  // [n]
  std::vector<double> error;  // [n]
  void resize(std::int64_t n) {
    value.assign(static_cast<std::size_t>(n), 0.0);
    error.assign(static_cast<std::size_t>(n), 0.0);
  }
  void zero() {
    std::fill(value.begin(), value.end(), 0.0);
    std::fill(error.begin(), error.end(), 0.0);
  }
};

struct Block {
  Bounded input;          // [seq, d] residual stream entering the block
  Bounded attn_rms;       // [seq]
  Bounded attn_normed;    // [seq, d]
  Bounded query_raw;      // [seq, H*hd] before RoPE (its magnitudes enter RoPE's rule)
  Bounded key_raw;        // [seq, G*hd]
  Bounded query;          // [seq, H*hd] after RoPE
  Bounded key;            // [seq, G*hd] after RoPE
  Bounded value;          // [seq, G*hd]
  Bounded probabilities;  // [H, seq, seq] span entries
  Bounded context;        // [seq, H*hd]
  Bounded mid;            // [seq, d]
  Bounded mlp_rms;        // [seq]
  Bounded mlp_normed;     // [seq, d]
  Bounded gate;           // [seq, F]
  Bounded up;             // [seq, F]
  Bounded hidden;         // [seq, F]
};

// The pass over one model: sizes, parameters and the gradient-error buffer it fills.
class ErrorPass {
 public:
  ErrorPass(const RunConfig& config, const std::vector<double>& params, const Rounding& rounding)
      : model_(config.model),
        layout_(make_model_layout(config.model)),
        params_(params),
        rounding_(rounding),
        d_(model_.hidden_size),
        hd_(model_.head_dim()),
        heads_(model_.num_attention_heads),
        groups_(model_.num_query_groups),
        qw_(heads_ * hd_),
        kvw_(model_.kv_width()),
        ffn_(model_.ffn_hidden_size),
        vocab_(model_.padded_vocab_size),
        // Every main-gradient element sums at most GBS x seq products of <= 2 factors, in
        // per-microbatch partial sums added into it, then over replicas.
        accumulation_terms_(2 * config.batch.global_batch_size * model_.seq_length + 8),
        gradient_error_(static_cast<std::size_t>(layout_.total_elements), 0.0) {}

  // Adds one sample's gradient errors; returns its CE-error sum and adds sum |CE| to `absolute`.
  double sample(const Sample& sample, double loss_scale, double& absolute) {
    forward(sample);
    const std::int64_t seq = seq_;
    logits_grad_.resize(seq * vocab_);
    const double loss_error = error_ops::cross_entropy_error(
        logits_.value.data(), logits_.error.data(), sample.labels.data(), sample.loss_mask.data(),
        seq, vocab_, loss_scale, rounding_, logits_grad_.value.data(), logits_grad_.error.data(),
        absolute);
    backward(sample);
    return loss_error;
  }

  std::vector<double>& gradient_error() { return gradient_error_; }

 private:
  const double* weight(std::int64_t index) const {
    return index < 0 ? nullptr : params_.data() + layout_.tensor(index).offset;
  }
  double* weight_error(std::int64_t index) {
    return index < 0 ? nullptr : gradient_error_.data() + layout_.tensor(index).offset;
  }

  void prepare(std::int64_t seq) {
    if (seq == seq_) return;
    seq_ = seq;
    blocks_.assign(static_cast<std::size_t>(model_.num_layers), Block{});
    for (Block& b : blocks_) {
      b.input.resize(seq * d_);
      b.attn_rms.resize(seq);
      b.attn_normed.resize(seq * d_);
      b.query_raw.resize(seq * qw_);
      b.key_raw.resize(seq * kvw_);
      b.query.resize(seq * qw_);
      b.key.resize(seq * kvw_);
      b.value.resize(seq * kvw_);
      b.probabilities.resize(heads_ * seq * seq);
      b.context.resize(seq * qw_);
      b.mid.resize(seq * d_);
      b.mlp_rms.resize(seq);
      b.mlp_normed.resize(seq * d_);
      b.gate.resize(seq * ffn_);
      b.up.resize(seq * ffn_);
      b.hidden.resize(seq * ffn_);
    }
    cosines_.assign(static_cast<std::size_t>(seq * hd_ / 2), 0.0);
    sines_.assign(static_cast<std::size_t>(seq * hd_ / 2), 0.0);
    table_error_.assign(static_cast<std::size_t>(seq * hd_ / 2), 0.0);
    stream_.resize(seq * d_);
    branch_.resize(seq * d_);
    final_rms_.resize(seq);
    final_normed_.resize(seq * d_);
    logits_.resize(seq * vocab_);
  }

  void linear(const Bounded& input, std::int64_t weight_index, std::int64_t bias_index,
              std::int64_t in, std::int64_t out, Bounded& output, bool compute_output = true) {
    reference::linear_forward(input.value.data(), weight(weight_index), weight(bias_index), seq_, in,
                              out, output.value.data());
    error_ops::linear_forward_error(input.value.data(), input.error.data(), weight(weight_index),
                                    weight(bias_index), output.value.data(), seq_, in, out,
                                    rounding_, compute_output, output.error.data());
  }

  void rmsnorm(const Bounded& input, std::int64_t weight_index, Bounded& rms, Bounded& output) {
    reference::rmsnorm_forward(input.value.data(), weight(weight_index), seq_, d_,
                               model_.norm_epsilon, output.value.data(), rms.value.data());
    error_ops::rmsnorm_forward_error(input.value.data(), input.error.data(), weight(weight_index),
                                     rms.value.data(), output.value.data(), seq_, d_, rounding_,
                                     rms.error.data(), output.error.data());
  }

  void rope(const Bounded& raw, std::int64_t heads, Bounded& rotated) {
    rotated = raw;
    reference::rope_forward(rotated.value.data(), cosines_.data(), sines_.data(), seq_, heads, hd_);
    error_ops::rope_error(raw.value.data(), rotated.error.data(), cosines_.data(), sines_.data(),
                          table_error_.data(), seq_, heads, hd_, rounding_);
  }

  // a + b, stored (bf16): e = e(a) + e(b) + (u + store) |a + b|.
  void add(const Bounded& a, const Bounded& b, Bounded& sum) const {
    for (std::size_t i = 0; i < a.value.size(); ++i) {
      sum.value[i] = a.value[i] + b.value[i];
      sum.error[i] = a.error[i] + b.error[i] + (rounding_.unit + rounding_.store) * std::abs(sum.value[i]);
    }
  }

  void forward(const Sample& sample) {
    prepare(static_cast<std::int64_t>(sample.tokens.size()));
    reference::rope_tables(sample.positions.data(), seq_, hd_, model_.rotary_base, cosines_.data(),
                           sines_.data());
    error_ops::rope_table_error(sample.positions.data(), seq_, hd_, model_.rotary_base, rounding_,
                                table_error_.data());
    // Embedding rows: exact copies, of bf16 compute weights in bf16.
    const double* embedding = weight(layout_.embedding);  // [V, d]
    for (std::int64_t t = 0; t < seq_; ++t) {
      for (std::int64_t j = 0; j < d_; ++j) {
        const double v = embedding[static_cast<std::int64_t>(sample.tokens[t]) * d_ + j];
        stream_.value[t * d_ + j] = v;
        stream_.error[t * d_ + j] = rounding_.store * std::abs(v);
      }
    }
    const error_ops::AttentionShape attention{seq_, heads_, groups_, hd_};
    for (std::int64_t layer = 0; layer < model_.num_layers; ++layer) {
      const LayerTensorIndices& index = layout_.layers[static_cast<std::size_t>(layer)];
      Block& b = blocks_[static_cast<std::size_t>(layer)];
      b.input = stream_;
      rmsnorm(b.input, index.input_norm, b.attn_rms, b.attn_normed);
      linear(b.attn_normed, index.q_weight, index.q_bias, d_, qw_, b.query_raw);
      linear(b.attn_normed, index.k_weight, index.k_bias, d_, kvw_, b.key_raw);
      linear(b.attn_normed, index.v_weight, index.v_bias, d_, kvw_, b.value);
      rope(b.query_raw, heads_, b.query);
      rope(b.key_raw, groups_, b.key);
      reference::AttentionShape shape{seq_, heads_, groups_, hd_};
      reference::attention_forward(b.query.value.data(), b.key.value.data(), b.value.value.data(),
                                   sample.attention_start.data(), shape,
                                   b.probabilities.value.data(), b.context.value.data());
      error_ops::attention_forward_error(
          b.query.value.data(), b.query.error.data(), b.key.value.data(), b.key.error.data(),
          b.value.value.data(), b.value.error.data(), sample.attention_start.data(), attention,
          b.probabilities.value.data(), b.context.value.data(), rounding_,
          b.probabilities.error.data(), b.context.error.data());
      linear(b.context, index.o_weight, index.o_bias, qw_, d_, branch_);
      add(b.input, branch_, b.mid);
      rmsnorm(b.mid, index.post_norm, b.mlp_rms, b.mlp_normed);
      linear(b.mlp_normed, index.gate_weight, index.gate_bias, d_, ffn_, b.gate);
      linear(b.mlp_normed, index.up_weight, index.up_bias, d_, ffn_, b.up);
      reference::swiglu_forward(b.gate.value.data(), b.up.value.data(), seq_ * ffn_, b.hidden.value.data());
      error_ops::swiglu_forward_error(b.gate.value.data(), b.gate.error.data(), b.up.value.data(),
                                      b.up.error.data(), seq_ * ffn_, rounding_, b.hidden.error.data());
      linear(b.hidden, index.down_weight, index.down_bias, ffn_, d_, branch_);
      add(b.mid, branch_, stream_);
    }
    rmsnorm(stream_, layout_.final_norm, final_rms_, final_normed_);
    linear(final_normed_, layout_.output, -1, d_, vocab_, logits_, false);  // fp32 logits (SPEC 5)
  }

  // dx += dy W and the weight's gradient errors; `input_grad` gets values and errors.
  void linear_back(const Bounded& input, std::int64_t weight_index, std::int64_t bias_index,
                   std::int64_t in, std::int64_t out, const Bounded& output_grad,
                   Bounded& input_grad) {
    error_ops::linear_backward_error(input.value.data(), input.error.data(), weight(weight_index),
                                     output_grad.value.data(), output_grad.error.data(), seq_, in,
                                     out, rounding_, accumulation_terms_, input_grad.value.data(),
                                     input_grad.error.data(), weight_error(weight_index),
                                     weight_error(bias_index));
  }

  void rmsnorm_back(const Bounded& input, std::int64_t weight_index, const Bounded& rms,
                    const Bounded& output_grad, Bounded& input_grad) {
    error_ops::rmsnorm_backward_error(input.value.data(), input.error.data(), weight(weight_index),
                                      rms.value.data(), rms.error.data(), output_grad.value.data(),
                                      output_grad.error.data(), seq_, d_, rounding_,
                                      accumulation_terms_, input_grad.value.data(),
                                      input_grad.error.data(), weight_error(weight_index));
  }

  void backward(const Sample& sample) {
    Bounded normed_grad, stream_grad, hidden_grad, gate_grad, up_grad, context_grad;
    normed_grad.resize(seq_ * d_);   // [seq, d]
    stream_grad.resize(seq_ * d_);   // [seq, d]
    hidden_grad.resize(seq_ * ffn_);  // [seq, F]
    gate_grad.resize(seq_ * ffn_);   // [seq, F]
    up_grad.resize(seq_ * ffn_);     // [seq, F]
    context_grad.resize(seq_ * qw_);  // [seq, H*hd]
    Bounded query_grad, key_grad, value_grad;
    query_grad.resize(seq_ * qw_);   // [seq, H*hd]
    key_grad.resize(seq_ * kvw_);    // [seq, G*hd]
    value_grad.resize(seq_ * kvw_);  // [seq, G*hd]

    linear_back(final_normed_, layout_.output, -1, d_, vocab_, logits_grad_, normed_grad);
    rmsnorm_back(stream_, layout_.final_norm, final_rms_, normed_grad, stream_grad);
    const error_ops::AttentionShape attention{seq_, heads_, groups_, hd_};
    for (std::int64_t layer = model_.num_layers - 1; layer >= 0; --layer) {
      const LayerTensorIndices& index = layout_.layers[static_cast<std::size_t>(layer)];
      Block& b = blocks_[static_cast<std::size_t>(layer)];
      hidden_grad.zero();
      linear_back(b.hidden, index.down_weight, index.down_bias, ffn_, d_, stream_grad, hidden_grad);
      std::fill(gate_grad.value.begin(), gate_grad.value.end(), 0.0);
      std::fill(up_grad.value.begin(), up_grad.value.end(), 0.0);
      reference::swiglu_backward(b.gate.value.data(), b.up.value.data(), hidden_grad.value.data(),
                                 seq_ * ffn_, gate_grad.value.data(), up_grad.value.data());
      error_ops::swiglu_backward_error(b.gate.value.data(), b.gate.error.data(), b.up.value.data(),
                                       b.up.error.data(), hidden_grad.value.data(),
                                       hidden_grad.error.data(), seq_ * ffn_, rounding_,
                                       gate_grad.error.data(), up_grad.error.data());
      normed_grad.zero();
      linear_back(b.mlp_normed, index.gate_weight, index.gate_bias, d_, ffn_, gate_grad, normed_grad);
      linear_back(b.mlp_normed, index.up_weight, index.up_bias, d_, ffn_, up_grad, normed_grad);
      rmsnorm_back(b.mid, index.post_norm, b.mlp_rms, normed_grad, stream_grad);

      context_grad.zero();
      linear_back(b.context, index.o_weight, index.o_bias, qw_, d_, stream_grad, context_grad);
      query_grad.zero();
      key_grad.zero();
      value_grad.zero();
      reference::AttentionShape shape{seq_, heads_, groups_, hd_};
      reference::attention_backward(b.query.value.data(), b.key.value.data(), b.value.value.data(),
                                    sample.attention_start.data(), shape,
                                    b.probabilities.value.data(), context_grad.value.data(),
                                    query_grad.value.data(), key_grad.value.data(),
                                    value_grad.value.data());
      error_ops::attention_backward_error(
          b.query.value.data(), b.query.error.data(), b.key.value.data(), b.key.error.data(),
          b.value.value.data(), b.value.error.data(), sample.attention_start.data(), attention,
          b.probabilities.value.data(), b.probabilities.error.data(), b.context.value.data(),
          b.context.error.data(), context_grad.value.data(), context_grad.error.data(),
          query_grad.value.data(), key_grad.value.data(), value_grad.value.data(), rounding_,
          query_grad.error.data(), key_grad.error.data(), value_grad.error.data());
      // RoPE's transpose: magnitudes of the gradients before it, errors in place.
      const Bounded query_grad_rotated = query_grad;  // [seq, H*hd]
      const Bounded key_grad_rotated = key_grad;      // [seq, G*hd]
      reference::rope_backward(query_grad.value.data(), cosines_.data(), sines_.data(), seq_, heads_, hd_);
      reference::rope_backward(key_grad.value.data(), cosines_.data(), sines_.data(), seq_, groups_, hd_);
      error_ops::rope_error(query_grad_rotated.value.data(), query_grad.error.data(), cosines_.data(),
                            sines_.data(), table_error_.data(), seq_, heads_, hd_, rounding_);
      error_ops::rope_error(key_grad_rotated.value.data(), key_grad.error.data(), cosines_.data(),
                            sines_.data(), table_error_.data(), seq_, groups_, hd_, rounding_);
      normed_grad.zero();
      linear_back(b.attn_normed, index.q_weight, index.q_bias, d_, qw_, query_grad, normed_grad);
      linear_back(b.attn_normed, index.k_weight, index.k_bias, d_, kvw_, key_grad, normed_grad);
      linear_back(b.attn_normed, index.v_weight, index.v_bias, d_, kvw_, value_grad, normed_grad);
      rmsnorm_back(b.input, index.input_norm, b.attn_rms, normed_grad, stream_grad);
    }
    // Embedding rows gather the stream gradient (tied: into the output projection's tensor).
    double* embedding_error = weight_error(layout_.embedding);  // [V, d]
    const double accumulate = rounding_.gamma(accumulation_terms_);
    for (std::int64_t t = 0; t < seq_; ++t) {
      for (std::int64_t j = 0; j < d_; ++j) {
        embedding_error[static_cast<std::int64_t>(sample.tokens[t]) * d_ + j] +=
            stream_grad.error[t * d_ + j] + accumulate * std::abs(stream_grad.value[t * d_ + j]);
      }
    }
  }

  const ModelConfig& model_;
  ModelLayout layout_;
  const std::vector<double>& params_;
  Rounding rounding_;
  std::int64_t d_, hd_, heads_, groups_, qw_, kvw_, ffn_, vocab_;
  std::int64_t accumulation_terms_;
  std::vector<double> gradient_error_;  // [P]
  std::int64_t seq_ = -1;
  std::vector<Block> blocks_;           // [L]
  std::vector<double> cosines_, sines_, table_error_;  // [seq, hd/2]
  Bounded stream_, branch_;             // [seq, d]
  Bounded final_rms_;                   // [seq]
  Bounded final_normed_;                // [seq, d]
  Bounded logits_;                      // [seq, V] fp32
  Bounded logits_grad_;                 // [seq, V]
};

}  // namespace

bool per_element_bounds_apply(const PrecisionPair& precisions) {
  return precisions.under_test.compute_roundoff <= precisions.under_test.unit_roundoff &&
         precisions.reference.compute_roundoff <= precisions.reference.unit_roundoff;
}

std::vector<double> sample_loss_scales(const RunConfig& config, const std::vector<Sample>& batch) {
  const std::int64_t first = batch.empty() ? 0 : batch.front().global_index;
  std::int64_t global_loss_tokens = 0;
  for (const Sample& sample : batch) global_loss_tokens += sample.loss_tokens;
  std::vector<double> scales(batch.size(), 0.0);
  if (config.data.loss_normalization == LossNormalization::per_token) {
    if (global_loss_tokens > 0) std::fill(scales.begin(), scales.end(), 1.0 / static_cast<double>(global_loss_tokens));
    return scales;
  }
  const std::int64_t microbatches = config.microbatches_per_replica();
  const std::int64_t dp = config.parallel.data_parallel;
  for (std::int64_t m = 0; m < microbatches; ++m) {
    for (std::int64_t r = 0; r < dp; ++r) {
      const std::vector<std::int64_t> indices =
          data::microbatch_sample_indices({first, m, r, config.batch.micro_batch_size, dp});
      std::int64_t tokens = 0;
      for (const std::int64_t index : indices) tokens += batch[static_cast<std::size_t>(index - first)].loss_tokens;
      if (tokens == 0) continue;
      for (const std::int64_t index : indices) {
        scales[static_cast<std::size_t>(index - first)] =
            1.0 / (static_cast<double>(tokens) * static_cast<double>(microbatches) * static_cast<double>(dp));
      }
    }
  }
  return scales;
}

GradientErrorBounds gradient_error_bounds(const RunConfig& config, const std::vector<double>& params,
                                          const std::vector<Sample>& batch,
                                          const PrecisionPair& precisions) {
  const Rounding rounding = error_ops::rounding_of(precisions);
  ErrorPass pass(config, params, rounding);
  const std::vector<double> scales = sample_loss_scales(config, batch);
  double loss_error_sum = 0;
  double absolute_loss = 0;
  std::int64_t loss_tokens = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    loss_error_sum += pass.sample(batch[i], scales[i], absolute_loss);
    loss_tokens += batch[i].loss_tokens;
  }
  GradientErrorBounds bounds;
  bounds.gradient = std::move(pass.gradient_error());
  for (double& bound : bounds.gradient) bound *= kSecondOrderMargin;
  if (loss_tokens > 0) {
    // loss = sum CE / T: each CE's error, the sum of GBS x seq rows and the division.
    const double tokens = static_cast<double>(loss_tokens);
    const std::int64_t rows = static_cast<std::int64_t>(batch.size()) * config.model.seq_length;
    bounds.loss = kSecondOrderMargin *
                  (loss_error_sum / tokens + (rounding.gamma(rows + 2) + rounding.unit) * absolute_loss / tokens);
  }
  return bounds;
}

}  // namespace tandem::equivalence
