// First-order rounding-error propagation through the reference model's operations
// (reference/model_ops.hpp), one function per operation, for the per-element gradient bounds of
// equivalence/error_bounds.hpp. Each takes the reference's values of its inputs and a bound on
// each input's error, and returns a bound on each output's error: the inputs' errors carried
// through the operation's derivative at the reference's point, plus the operation's own rounding
// bounded on absolute values (Higham, Accuracy and Stability of Numerical Algorithms, ch. 3: a
// sum or dot product of n terms in any order errs by at most gamma_n x sum |terms|; a chain of k
// roundings by gamma_k relative). docs/EQUIVALENCE.md derives each rule.
//
// An "error" is a bound on |computed - exact| that covers BOTH twins of a comparison at once:
// every rounding is counted with u_test + u_ref (Rounding), so |test - ref| <= error. First order:
// products of two roundings are left out; error_bounds.cpp doubles the result for them.
//
// Conventions as reference/model_ops.hpp: row-major arrays, shapes beside each parameter;
// "+=" outputs accumulate, "=" outputs are overwritten.
#pragma once

#include <cstdint>

#include "equivalence/tolerance.hpp"

namespace tandem::equivalence::error_ops {

// How much one operation may round, on both sides of a comparison together.
struct Rounding {
  PrecisionPair precisions;
  double unit = 0;   // u_test + u_ref: one rounding of an arithmetic operation on either side
  // Relative error of one compute-typed store (a bf16 activation or compute weight), summed over
  // the sides whose compute type is coarser than their arithmetic; 0 without bf16.
  double store = 0;
  // gamma_n(u_test) + gamma_n(u_ref): a chain of n roundings, or a sum of n terms, on each side.
  double gamma(std::int64_t terms) const;
};
Rounding rounding_of(const PrecisionPair& precisions);

// Plain products on the reference's values or on bounds (no rounding analysis of their own).
// c[rows, outs] += a[rows, depth] b[outs, depth]^T
void product_abt(const double* a, const double* b, std::int64_t rows, std::int64_t depth,
                 std::int64_t outs, double* c);
// c[rows, depth] += a[rows, outs] b[outs, depth]
void product_ab(const double* a, const double* b, std::int64_t rows, std::int64_t outs,
                std::int64_t depth, double* c);
// c[outs, depth] += a[rows, outs]^T b[rows, depth]
void product_atb(const double* a, const double* b, std::int64_t rows, std::int64_t outs,
                 std::int64_t depth, double* c);

// y = x W^T (+ b); `compute_output`: y is stored in the compute type (not the fp32 logits).
void linear_forward_error(const double* input,         // [rows, in]
                          const double* input_error,   // [rows, in]
                          const double* weight,        // [out, in]
                          const double* bias,          // [out] or null
                          const double* output,        // [rows, out] the reference's y
                          std::int64_t rows, std::int64_t in, std::int64_t out,
                          const Rounding& rounding, bool compute_output,
                          double* output_error);       // [rows, out] =

// dx += dy W (values and errors), dW += dy^T x and db += column sums of dy (errors only).
// `accumulation_terms`: the longest chain of roundings into one main-gradient element.
void linear_backward_error(const double* input,              // [rows, in]
                           const double* input_error,        // [rows, in]
                           const double* weight,             // [out, in]
                           const double* output_grad,        // [rows, out]
                           const double* output_grad_error,  // [rows, out]
                           std::int64_t rows, std::int64_t in, std::int64_t out,
                           const Rounding& rounding, std::int64_t accumulation_terms,
                           double* input_grad,               // [rows, in] += values (null: none)
                           double* input_grad_error,         // [rows, in] +=
                           double* weight_grad_error,        // [out, in] +=
                           double* bias_grad_error);         // [out] += (null: no bias)

// y = x r w, r = 1/sqrt(mean(x^2) + eps).
void rmsnorm_forward_error(const double* input,         // [rows, width]
                           const double* input_error,   // [rows, width]
                           const double* weight,        // [width]
                           const double* inverse_rms,   // [rows] the reference's r
                           const double* output,        // [rows, width]
                           std::int64_t rows, std::int64_t width, const Rounding& rounding,
                           double* inverse_rms_error,   // [rows] =
                           double* output_error);       // [rows, width] =

void rmsnorm_backward_error(const double* input,              // [rows, width]
                            const double* input_error,        // [rows, width]
                            const double* weight,             // [width]
                            const double* inverse_rms,        // [rows]
                            const double* inverse_rms_error,  // [rows]
                            const double* output_grad,        // [rows, width]
                            const double* output_grad_error,  // [rows, width]
                            std::int64_t rows, std::int64_t width, const Rounding& rounding,
                            std::int64_t accumulation_terms,
                            double* input_grad,               // [rows, width] += values
                            double* input_grad_error,         // [rows, width] +=
                            double* weight_grad_error);       // [width] +=

// RoPE's rotation (forward) or its transpose (backward): the same magnitudes. `values` are the
// reference's activations BEFORE the rotation; `table_error` bounds the cos/sin tables' errors.
void rope_error(const double* values,        // [rows, heads * hd]
                double* error,               // [rows, heads * hd] in place
                const double* cosines, const double* sines,  // [rows, hd/2] each
                const double* table_error,   // [rows, hd/2]
                std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                const Rounding& rounding);
// The tables' errors: angle = position x base^(-2i/hd) rounds by u |angle|, cos/sin by u.
void rope_table_error(const std::int32_t* positions, std::int64_t rows, std::int64_t head_dim,
                      double base, const Rounding& rounding,
                      double* table_error);  // [rows, hd/2] =

struct AttentionShape {
  std::int64_t rows = 0, heads = 0, groups = 0, head_dim = 0;
};

// Scores, softmax over each span, context (reference attention_forward), with the error of the
// probabilities kept for the backward.
void attention_forward_error(const double* query, const double* query_error,   // [rows, H*hd]
                             const double* key, const double* key_error,       // [rows, G*hd]
                             const double* value, const double* value_error,   // [rows, G*hd]
                             const std::int32_t* attention_start,              // [rows]
                             const AttentionShape& shape,
                             const double* probabilities,  // [H, rows, rows] the reference's
                             const double* context,        // [rows, H*hd]
                             const Rounding& rounding,
                             double* probability_error,    // [H, rows, rows] = (span entries)
                             double* context_error);       // [rows, H*hd] =

// The errors of dq, dk, dv; `*_grad` are the reference's values (attention_backward).
void attention_backward_error(const double* query, const double* query_error,
                              const double* key, const double* key_error,
                              const double* value, const double* value_error,
                              const std::int32_t* attention_start, const AttentionShape& shape,
                              const double* probabilities, const double* probability_error,
                              const double* context, const double* context_error,
                              const double* context_grad, const double* context_grad_error,
                              const double* query_grad, const double* key_grad,
                              const double* value_grad,  // values, to bound their stores
                              const Rounding& rounding,
                              double* query_grad_error,  // [rows, H*hd] =
                              double* key_grad_error,    // [rows, G*hd] =
                              double* value_grad_error); // [rows, G*hd] =

// hidden = silu(gate) up.
void swiglu_forward_error(const double* gate, const double* gate_error,  // [count]
                          const double* up, const double* up_error,      // [count]
                          std::int64_t count, const Rounding& rounding,
                          double* hidden_error);                         // [count] =

void swiglu_backward_error(const double* gate, const double* gate_error,
                           const double* up, const double* up_error,
                           const double* hidden_grad, const double* hidden_grad_error,
                           std::int64_t count, const Rounding& rounding,
                           double* gate_grad_error,  // [count] =
                           double* up_grad_error);   // [count] =

// Masked cross-entropy: per counted row, the error of its CE and of loss_scale x (softmax -
// onehot). Returns the sum over counted rows of the CE errors; `absolute_loss` += sum |CE|.
double cross_entropy_error(const double* logits, const double* logits_error,  // [rows, vocab]
                           const std::int32_t* labels, const std::uint8_t* loss_mask,  // [rows]
                           std::int64_t rows, std::int64_t vocab, double loss_scale,
                           const Rounding& rounding,
                           double* logits_grad,        // [rows, vocab] = values
                           double* logits_grad_error,  // [rows, vocab] =
                           double& absolute_loss);

}  // namespace tandem::equivalence::error_ops
