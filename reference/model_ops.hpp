// The reference model's operations, each a forward and a hand-written backward (SPEC 4, 5).
// Boring on purpose: plain loops over row-major arrays, every sum accumulated in the scalar type
// `Real` itself (double, or boost::multiprecision::cpp_bin_float_50 for the finite-difference
// proofs), so each line can be read against SPEC 4. Instantiated for those two types in
// reference/model_ops.cpp; the whole model (reference/model.hpp) is built from these.
//
// Conventions:
//   - every array is row-major; its shape is in the comment beside the parameter;
//   - a backward ADDS into its gradient outputs (`+=`), so residual branches and a tied
//     embedding sum their contributions naturally; callers zero what must start at zero;
//   - a null bias pointer means "no bias" (SPEC 4: --disable-bias-linear is the default).
#pragma once

#include <cstdint>

namespace tandem::reference {

// RMSNorm (SPEC 4): output = input / sqrt(mean(input^2) + epsilon) * weight, row by row.
template <class Real>
void rmsnorm_forward(const Real* input,     // [rows, width]
                     const Real* weight,    // [width]
                     std::int64_t rows, std::int64_t width, const Real& epsilon,
                     Real* output,          // [rows, width]
                     Real* inverse_rms);    // [rows] saved for the backward: 1/sqrt(mean+eps)

template <class Real>
void rmsnorm_backward(const Real* input,        // [rows, width]
                      const Real* weight,       // [width]
                      const Real* inverse_rms,  // [rows] from the forward
                      const Real* output_grad,  // [rows, width]
                      std::int64_t rows, std::int64_t width,
                      Real* input_grad,         // [rows, width] +=
                      Real* weight_grad);       // [width] +=

// A linear layer in PyTorch's convention: output = input * weight^T + bias.
template <class Real>
void linear_forward(const Real* input,   // [rows, in_features]
                    const Real* weight,  // [out_features, in_features]
                    const Real* bias,    // [out_features] or null
                    std::int64_t rows, std::int64_t in_features, std::int64_t out_features,
                    Real* output);       // [rows, out_features]

template <class Real>
void linear_backward(const Real* input,        // [rows, in_features]
                     const Real* weight,       // [out_features, in_features]
                     const Real* output_grad,  // [rows, out_features]
                     std::int64_t rows, std::int64_t in_features, std::int64_t out_features,
                     Real* input_grad,         // [rows, in_features] += (null: not needed)
                     Real* weight_grad,        // [out_features, in_features] +=
                     Real* bias_grad);         // [out_features] += (null: no bias)

// RoPE angles (SPEC 4): for row t and pair i in [0, head_dim/2), the angle is
// positions[t] * base^(-2i/head_dim); the tables hold its cosine and sine.
template <class Real>
void rope_tables(const std::int32_t* positions,  // [rows]
                 std::int64_t rows, std::int64_t head_dim, const Real& base,
                 Real* cosines,                   // [rows, head_dim/2]
                 Real* sines);                    // [rows, head_dim/2]

// RoPE, rotate-half convention, in place: in every head, the pair (i, i + head_dim/2) is rotated
// by the row's angle i: (a, b) -> (a cos - b sin, b cos + a sin).
template <class Real>
void rope_forward(Real* activations,   // [rows, heads * head_dim] rotated in place
                  const Real* cosines, const Real* sines,  // [rows, head_dim/2] each
                  std::int64_t rows, std::int64_t heads, std::int64_t head_dim);

// The backward of a rotation is the inverse rotation (its transpose), applied in place to the
// gradient: (da, db) -> (da cos + db sin, db cos - da sin).
template <class Real>
void rope_backward(Real* gradients,    // [rows, heads * head_dim] rotated back in place
                   const Real* cosines, const Real* sines,  // [rows, head_dim/2] each
                   std::int64_t rows, std::int64_t heads, std::int64_t head_dim);

struct AttentionShape {
  std::int64_t rows = 0;       // sequence positions
  std::int64_t heads = 0;      // query heads H
  std::int64_t groups = 0;     // key/value groups G; query head j reads group j / (H/G)
  std::int64_t head_dim = 0;   // hd
};

// Attention with document spans (SPEC 3, 4): row t of query head j attends to rows
// s in [attention_start[t], t] of group j / (H/G), with scores q_t . k_s / sqrt(hd) and a softmax
// over exactly that span; context_t = sum_s p_ts v_s. Only the span entries of `probabilities`
// are written (and read by the backward); the rest is never touched.
template <class Real>
void attention_forward(const Real* query,   // [rows, H*hd] after RoPE
                       const Real* key,     // [rows, G*hd] after RoPE
                       const Real* value,   // [rows, G*hd]
                       const std::int32_t* attention_start,  // [rows], 0 <= start[t] <= t
                       const AttentionShape& shape,
                       Real* probabilities,  // [H, rows, rows]
                       Real* context);       // [rows, H*hd]

template <class Real>
void attention_backward(const Real* query, const Real* key, const Real* value,  // as forward
                        const std::int32_t* attention_start,  // [rows]
                        const AttentionShape& shape,
                        const Real* probabilities,  // [H, rows, rows] from the forward
                        const Real* context_grad,   // [rows, H*hd]
                        Real* query_grad,           // [rows, H*hd] +=
                        Real* key_grad,             // [rows, G*hd] +=
                        Real* value_grad);          // [rows, G*hd] +=

// SwiGLU's product (SPEC 4): hidden = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
template <class Real>
void swiglu_forward(const Real* gate,   // [count]
                    const Real* up,     // [count]
                    std::int64_t count,
                    Real* hidden);      // [count]

template <class Real>
void swiglu_backward(const Real* gate, const Real* up,  // [count] each
                     const Real* hidden_grad,           // [count]
                     std::int64_t count,
                     Real* gate_grad,                   // [count] +=
                     Real* up_grad);                    // [count] +=

// The softmax backward's D_t = sum over the span of p_ts dp_ts (attention_backward), summed in s
// order. An overload for another scalar type may model twins that form D_t otherwise (equivalence/
// rounding_probe.hpp: production takes dctx_t . context_t, whose roundings are the forward's).
template <class Real>
Real attention_expected_grad(const Real* probabilities,      // [rows] p_t, span entries
                             const Real* probability_grads,  // [rows] dp_t, span entries
                             std::int64_t first, std::int64_t last,
                             const Real* /*context_grad*/,   // [hd] dctx_t
                             const Real* /*values*/,         // v_s at values + s * value_stride
                             std::int64_t /*value_stride*/, std::int64_t /*head_dim*/) {
  Real expected = 0;
  for (std::int64_t s = first; s <= last; ++s) expected += probabilities[s] * probability_grads[s];
  return expected;
}

// Adds `part` (a row's cross-entropy, or a sample's masked sum of them) to a masked loss sum
// (SPEC 5): `sum += part`. An overload for another scalar type may model twins that keep this sum
// in a wider type than their other arithmetic (equivalence/rounding_probe.hpp: production sums
// its fp32 row losses in double).
template <class Real>
void add_to_loss_sum(Real& sum, const Real& part) {
  sum += part;
}

// Masked cross-entropy (SPEC 5): returns sum over rows with loss_mask 1 of
// logsumexp(logits_t) - logits_t[label_t], over the whole (padded) vocabulary. Rows with mask 0
// are skipped: they contribute exactly 0 to the sum and to the gradient. When logits_grad is not
// null, adds loss_scale * (softmax(logits_t) - onehot(label_t)) for every counted row.
template <class Real>
Real cross_entropy_forward_backward(const Real* logits,             // [rows, vocab]
                                    const std::int32_t* labels,     // [rows], in [0, vocab)
                                    const std::uint8_t* loss_mask,  // [rows], 0 or 1
                                    std::int64_t rows, std::int64_t vocab, const Real& loss_scale,
                                    Real* logits_grad);             // [rows, vocab] += or null

}  // namespace tandem::reference
