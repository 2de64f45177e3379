// The harness's derived tolerances (tolerance.hpp).
#include "equivalence/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model_layout.hpp"

namespace tandem::equivalence {
namespace {

// reference/audit.cpp: first-order bounds doubled to cover products of two roundings.
constexpr double kSecondOrderMargin = 2.0;
// Compute-typed roundings per decoder block on the longest path: the stores of input norm, q/k/v
// projections, rope, attention, o projection, residual add, post norm, gate, up, swiglu, down,
// residual add (14), plus the one bf16 rounding inside attention on any path through it (the
// probabilities before p v in the forward; p before dv or dz before dq, dk in the backward:
// production/kernels/attention.hpp, docs/EQUIVALENCE.md).
constexpr std::int64_t kStoresPerBlock = 15;
// Outside the blocks: embedding, final norm, output projection.
constexpr std::int64_t kStoresOutsideBlocks = 3;

double sum_of_gammas(std::int64_t terms, const PrecisionPair& p) {
  return gamma(terms, p.under_test.unit_roundoff) + gamma(terms, p.reference.unit_roundoff);
}

// Each side's rounding of its own norm: P squares summed and a root, in its norm arithmetic.
double norm_rounding(std::int64_t elements, const PrecisionPair& p) {
  return gamma(elements + 1, p.under_test.norm_roundoff) + gamma(elements + 1, p.reference.norm_roundoff);
}

// The bf16 compute-store term: one rounding of u_compute per store along the path, for whichever
// side has compute stores coarser than its accumulation.
double compute_store_factor(const ReductionShape& shape, const PrecisionPair& p) {
  double factor = 0;
  for (const Precision* side : {&p.under_test, &p.reference}) {
    if (side->compute_roundoff > side->unit_roundoff) {
      factor += static_cast<double>(shape.forward_depth) * side->compute_roundoff;
    }
  }
  return factor;
}

// 1 - b^t by t multiplications: relative error <= t u b^t / (1 - b^t) + u (reference/audit.cpp).
double bias_correction_error(double beta, std::int64_t step, double u) {
  const double power = std::pow(beta, static_cast<double>(step));
  return power >= 1.0 ? 0.0 : static_cast<double>(step) * u * power / (1.0 - power) + u;
}

}  // namespace

std::string to_string(Comparison comparison) {
  switch (comparison) {
    case Comparison::exact: return "exact";
    case Comparison::deterministic: return "deterministic";
    case Comparison::approximate: return "approximate";
  }
  return "?";
}

Precision fp64() {
  return {"fp64", std::ldexp(1.0, -53), std::ldexp(1.0, -53), std::ldexp(1.0, -1075), std::ldexp(1.0, -53)};
}
// cpp_bin_float_50's exponent range is far wider than double's: no underflow in range.
Precision float50() { return {"float50", std::ldexp(1.0, -166), std::ldexp(1.0, -166), 0.0, std::ldexp(1.0, -166)}; }
// fp32 and bf16 are production's: its norm adds exact squares in double (norm_roundoff).
Precision fp32() {
  return {"fp32", std::ldexp(1.0, -24), std::ldexp(1.0, -24), std::ldexp(1.0, -150), std::ldexp(1.0, -53)};
}
Precision bf16() {
  return {"bf16", std::ldexp(1.0, -24), std::ldexp(1.0, -8), std::ldexp(1.0, -150), std::ldexp(1.0, -53)};
}

double gamma(std::int64_t terms, double unit_roundoff) {
  const double nu = static_cast<double>(terms) * unit_roundoff;
  if (nu >= 1.0) return std::numeric_limits<double>::infinity();
  return nu / (1.0 - nu);
}

ReductionShape reduction_shape(const RunConfig& config) {
  const ModelConfig& model = config.model;
  ReductionShape shape;
  const std::int64_t width =
      std::max({model.hidden_size, model.ffn_hidden_size, model.padded_vocab_size});
  shape.samples = config.batch.global_batch_size;
  shape.gradient_terms = config.batch.global_batch_size * model.seq_length * width;
  shape.elements = make_model_layout(model).total_elements;
  shape.forward_depth = 2 * (kStoresPerBlock * model.num_layers + kStoresOutsideBlocks);
  return shape;
}

double gradient_bound(const ReductionShape& shape, const PrecisionPair& precisions,
                      double max_abs_gradient) {
  const double magnitude = max_abs_gradient * static_cast<double>(shape.samples);
  return (sum_of_gammas(shape.gradient_terms, precisions) +
          compute_store_factor(shape, precisions)) * magnitude;
}

double norm_bound(const ReductionShape& shape, const PrecisionPair& precisions,
                  double gradient_element_bound, double norm) {
  return std::sqrt(static_cast<double>(shape.elements)) * gradient_element_bound +
         norm_rounding(shape.elements, precisions) * norm;
}

double norm_bound_from_elements(const ReductionShape& shape, const PrecisionPair& precisions,
                                const std::vector<double>& element_bounds,
                                const std::vector<double>& gradient, double norm) {
  double error_squares = 0;  // ||e||^2
  double across = 0;         // sum |a_i| e_i
  double value_squares = 0;  // ||a||^2
  for (std::size_t i = 0; i < element_bounds.size(); ++i) {
    const double e = element_bounds[i];
    const double a = i < gradient.size() ? std::abs(gradient[i]) : 0.0;
    error_squares += e * e;
    across += a * e;
    value_squares += a * a;
  }
  const double error_norm = std::sqrt(error_squares);
  double difference = error_norm;
  // ||a|| from these double sums errs by far less than 1e-9 relative (P < 1e6 terms at 2^-53):
  // taken 1e-9 smaller, the quotient stays an upper bound.
  const double value_norm = std::sqrt(value_squares) * (1 - 1e-9);
  if (value_norm > 0) {
    const double denominator = value_norm + std::max(0.0, value_norm - error_norm);
    difference = std::min(difference, (2 * across + error_squares) / denominator * (1 + 1e-9));
  }
  return difference + norm_rounding(shape.elements, precisions) * norm;
}

double loss_bound(const ReductionShape& shape, const PrecisionPair& precisions, double loss,
                  std::int64_t padded_vocab_size) {
  const double magnitude = std::abs(loss) + std::log(static_cast<double>(padded_vocab_size));
  return (sum_of_gammas(shape.gradient_terms, precisions) +
          compute_store_factor(shape, precisions)) * magnitude;
}

AdamwElementBound adamw_element_bound(const AdamwElementInput& in,
                                      const PrecisionPair& precisions) {
  const double u = precisions.under_test.unit_roundoff + precisions.reference.unit_roundoff;
  const double dg = in.grad_error;
  const double g = std::abs(in.grad);
  // m = b1 m + (1 - b1) g
  const double m_terms = std::abs(in.beta1 * in.exp_avg) + (1 - in.beta1) * g;
  const double m_new = in.beta1 * in.exp_avg + (1 - in.beta1) * in.grad;
  const double dm = (1 - in.beta1) * dg + 3 * u * m_terms;
  // v = b2 v + (1 - b2) g^2
  const double v_terms = in.beta2 * in.exp_avg_sq + (1 - in.beta2) * g * g;
  const double dv = (1 - in.beta2) * (2 * g * dg + dg * dg) + 4 * u * v_terms;
  // m_hat, v_hat with the bias corrections' own errors
  const double bc1 = 1 - std::pow(in.beta1, static_cast<double>(in.step));
  const double bc2 = 1 - std::pow(in.beta2, static_cast<double>(in.step));
  const double e1 = bias_correction_error(in.beta1, in.step, precisions.under_test.unit_roundoff) +
                    bias_correction_error(in.beta1, in.step, precisions.reference.unit_roundoff);
  const double e2 = bias_correction_error(in.beta2, in.step, precisions.under_test.unit_roundoff) +
                    bias_correction_error(in.beta2, in.step, precisions.reference.unit_roundoff);
  const double m_hat = std::abs(m_new) / bc1;
  const double v_hat = std::max(0.0, v_terms) / bc2;
  const double dm_hat = dm / bc1 + m_hat * (e1 + u);
  const double dv_hat = dv / bc2 + v_hat * (e2 + u);
  // s = sqrt(v_hat): |sqrt(x) - sqrt(y)| <= min(sqrt|x - y|, |x - y| / (2 sqrt(x)))
  const double s = std::sqrt(v_hat);
  double ds = std::sqrt(dv_hat);
  if (s > 0) ds = std::min(ds, dv_hat / (2 * s));
  ds += u * s;
  // a = m_hat / (s + eps), the other side's denominator at least (s - ds) + eps
  const double denominator = s + in.eps;
  const double denominator_low = std::max(0.0, s - ds) + in.eps;
  const double a = m_hat / denominator;
  double da = dm_hat / denominator_low + m_hat * ds / (denominator * denominator_low) + 6 * u * a;
  if (std::isinf(s) && std::isfinite(m_hat)) da = 0;  // v = inf: the Adam term is exactly 0
  // p = p - lr (a + wd p), on magnitudes: the schedule keeps lr and wd >= 0, but a bound must
  // stay one for any lr and wd it is handed (a negative lr once made this bound negative).
  const double lr = std::abs(in.lr);
  const double step_terms = a + std::abs(in.wd) * std::abs(in.param);
  const double p_new = std::abs(in.param) + lr * step_terms;
  const double dp = lr * da + 3 * u * lr * step_terms + u * p_new;

  // Underflow: each rounding may lose up to half the smallest subnormal (3 roundings for m, 4 for
  // v, and for p the step's 4 plus the Adam term's through lr).
  const double eta = precisions.under_test.underflow + precisions.reference.underflow;
  AdamwElementBound bound;
  bound.exp_avg = kSecondOrderMargin * (dm + 3 * eta);
  bound.exp_avg_sq = kSecondOrderMargin * (dv + 4 * eta);
  bound.param = kSecondOrderMargin * (dp + 4 * eta + lr * 6 * eta / in.eps);
  return bound;
}

double clipped_gradient_bound(double grad, double grad_error, double norm, double norm_error,
                              double coeff, const PrecisionPair& precisions) {
  const double u = precisions.under_test.unit_roundoff + precisions.reference.unit_roundoff;
  const double shifted = norm + kClipNormEpsilon;  // SPEC 6
  const double low = std::max(shifted - norm_error, kClipNormEpsilon);
  const double coeff_error = std::min(1.0, coeff * norm_error / low + 2 * u * coeff);  // in (0, 1]
  return coeff * grad_error + std::abs(grad) * coeff_error + u * std::abs(grad) * coeff;
}

}  // namespace tandem::equivalence
