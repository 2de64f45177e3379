// First-order error propagation per operation (error_ops.hpp). Every rule reads
//   error(out) = sum over inputs |d out / d in| error(in)   (the inputs' errors, carried)
//              + rounding x (the same computation on absolute values)   (its own rounding),
// with the rounding constants generous enough for every implementation the twins use: the
// host's and CUDA's exp/log (CUDA's expf/logf: a few ulp plus ~1.2 ulp per unit of |argument|,
// taken here as u (8 + 4|x|)), the max-shifted or online softmax, GEMMs in any order.
#include "equivalence/error_ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::equivalence::error_ops {
namespace {

// exp, log, pow, rsqrt of the host libraries and CUDA err by at most 2 ulp = 4u near 1; counted
// twice over, in units of u.
constexpr double kLibraryUnits = 8.0;
// CUDA's expf errs by a further ~1.2 ulp (2.4u) per unit of |x|; with the argument's own rounding,
// counted as 4u per unit.
constexpr double kUnitsPerArgument = 4.0;

// Relative error of exp(x) or absolute error of log(y) = x, on either side.
double transcendental_error(const Rounding& r, double x) {
  return r.unit * (kLibraryUnits + kUnitsPerArgument * std::abs(x));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

double Rounding::gamma(std::int64_t terms) const {
  return equivalence::gamma(terms, precisions.under_test.unit_roundoff) +
         equivalence::gamma(terms, precisions.reference.unit_roundoff);
}

Rounding rounding_of(const PrecisionPair& precisions) {
  Rounding r;
  r.precisions = precisions;
  r.unit = precisions.under_test.unit_roundoff + precisions.reference.unit_roundoff;
  for (const Precision* side : {&precisions.under_test, &precisions.reference}) {
    if (side->compute_roundoff > side->unit_roundoff) r.store += side->compute_roundoff;
  }
  return r;
}

void product_abt(const double* a, const double* b, std::int64_t rows, std::int64_t depth,
                 std::int64_t outs, double* c) {
  for (std::int64_t row = 0; row < rows; ++row) {
    const double* x = a + row * depth;  // [depth]
    for (std::int64_t out = 0; out < outs; ++out) {
      const double* w = b + out * depth;  // [depth]
      double sum = 0;
      for (std::int64_t i = 0; i < depth; ++i) sum += x[i] * w[i];
      c[row * outs + out] += sum;
    }
  }
}

void product_ab(const double* a, const double* b, std::int64_t rows, std::int64_t outs,
                std::int64_t depth, double* c) {
  for (std::int64_t row = 0; row < rows; ++row) {
    double* y = c + row * depth;  // [depth]
    for (std::int64_t out = 0; out < outs; ++out) {
      const double scale = a[row * outs + out];
      if (scale == 0) continue;
      const double* w = b + out * depth;  // [depth]
      for (std::int64_t i = 0; i < depth; ++i) y[i] += scale * w[i];
    }
  }
}

void product_atb(const double* a, const double* b, std::int64_t rows, std::int64_t outs,
                 std::int64_t depth, double* c) {
  for (std::int64_t row = 0; row < rows; ++row) {
    const double* x = b + row * depth;  // [depth]
    for (std::int64_t out = 0; out < outs; ++out) {
      const double scale = a[row * outs + out];
      if (scale == 0) continue;
      double* y = c + out * depth;  // [depth]
      for (std::int64_t i = 0; i < depth; ++i) y[i] += scale * x[i];
    }
  }
}

void linear_forward_error(const double* input, const double* input_error, const double* weight,
                          const double* bias, const double* output, std::int64_t rows,
                          std::int64_t in, std::int64_t out, const Rounding& r,
                          bool compute_output, double* output_error) {
  // y = sum_i x_i w_i (+ b): |dy| <= sum |w| e(x) + (gamma_{in+2} + store_w) (sum |x||w| + |b|),
  // then the bias add and the store: (u + store) |y|.
  const double own = r.gamma(in + 2) + r.store;
  std::vector<double> carried(static_cast<std::size_t>(rows * in));  // [rows, in]
  for (std::int64_t i = 0; i < rows * in; ++i) carried[i] = input_error[i] + own * std::abs(input[i]);
  std::vector<double> absolute_weight(static_cast<std::size_t>(out * in));  // [out, in]
  for (std::int64_t i = 0; i < out * in; ++i) absolute_weight[i] = std::abs(weight[i]);
  std::fill(output_error, output_error + rows * out, 0.0);
  product_abt(carried.data(), absolute_weight.data(), rows, in, out, output_error);
  const double store = r.unit + (compute_output ? r.store : 0.0);
  for (std::int64_t row = 0; row < rows; ++row) {
    for (std::int64_t o = 0; o < out; ++o) {
      double& e = output_error[row * out + o];
      if (bias != nullptr) e += own * std::abs(bias[o]);
      e += store * std::abs(output[row * out + o]);
    }
  }
}

void linear_backward_error(const double* input, const double* input_error, const double* weight,
                           const double* output_grad, const double* output_grad_error,
                           std::int64_t rows, std::int64_t in, std::int64_t out,
                           const Rounding& r, std::int64_t accumulation_terms, double* input_grad,
                           double* input_grad_error, double* weight_grad_error,
                           double* bias_grad_error) {
  std::vector<double> absolute(static_cast<std::size_t>(rows * std::max(in, out)));  // [rows, out]
  if (input_grad != nullptr) {
    // dx = dy W: e(dx) = (e(dy) + (gamma_{out+2} + store_w) |dy|) |W|; then the accumulate and
    // the store round by (u + store) (|dx before| + |contribution|).
    const double own = r.gamma(out + 2) + r.store;
    for (std::int64_t i = 0; i < rows * out; ++i) {
      absolute[i] = output_grad_error[i] + own * std::abs(output_grad[i]);
    }
    std::vector<double> absolute_weight(static_cast<std::size_t>(out * in));  // [out, in]
    for (std::int64_t i = 0; i < out * in; ++i) absolute_weight[i] = std::abs(weight[i]);
    product_ab(absolute.data(), absolute_weight.data(), rows, out, in, input_grad_error);
    std::vector<double> contribution(static_cast<std::size_t>(rows * in), 0.0);  // [rows, in]
    product_ab(output_grad, weight, rows, out, in, contribution.data());
    for (std::int64_t i = 0; i < rows * in; ++i) {
      input_grad_error[i] += (r.unit + r.store) * (std::abs(input_grad[i]) + std::abs(contribution[i]));
      input_grad[i] += contribution[i];
    }
  }
  // dW = sum_rows dy^T x into the fp32 main gradient over the whole global batch:
  // e(dW) = (e(dy) + gamma_acc |dy|)^T |x| + |dy|^T e(x); db likewise with x = 1.
  const double accumulate = r.gamma(accumulation_terms);
  for (std::int64_t i = 0; i < rows * out; ++i) {
    absolute[i] = output_grad_error[i] + accumulate * std::abs(output_grad[i]);
  }
  std::vector<double> absolute_input(static_cast<std::size_t>(rows * in));  // [rows, in]
  for (std::int64_t i = 0; i < rows * in; ++i) absolute_input[i] = std::abs(input[i]);
  product_atb(absolute.data(), absolute_input.data(), rows, out, in, weight_grad_error);
  if (bias_grad_error != nullptr) {
    for (std::int64_t row = 0; row < rows; ++row) {
      for (std::int64_t o = 0; o < out; ++o) bias_grad_error[o] += absolute[row * out + o];
    }
  }
  for (std::int64_t i = 0; i < rows * out; ++i) absolute[i] = std::abs(output_grad[i]);
  product_atb(absolute.data(), input_error, rows, out, in, weight_grad_error);
}

void rmsnorm_forward_error(const double* input, const double* input_error, const double* weight,
                           const double* inverse_rms, const double* output, std::int64_t rows,
                           std::int64_t width, const Rounding& r, double* inverse_rms_error,
                           double* output_error) {
  for (std::int64_t row = 0; row < rows; ++row) {
    const double* x = input + row * width;        // [width]
    const double* ex = input_error + row * width;  // [width]
    const double scale = inverse_rms[row];
    // r = (sum x^2 / w + eps)^(-1/2): dr/dx_k = -r^3 x_k / w. Its own rounding: the sum of w
    // squares, the mean and eps (gamma_{w+2}), then sqrt and reciprocal (rsqrt: a few ulp).
    double carried = 0;
    for (std::int64_t k = 0; k < width; ++k) carried += std::abs(x[k]) * ex[k];
    const double er = scale * scale * scale * carried / static_cast<double>(width) +
                      scale * (r.gamma(width + 2) + kLibraryUnits * r.unit);
    inverse_rms_error[row] = er;
    // y_j = x_j r w_j: carried e(x) r |w| + |x w| e(r); two products and the store round
    // (gamma_3), the compute weight and the store in bf16 (2 store) relative to |y|.
    for (std::int64_t j = 0; j < width; ++j) {
      const double y = output[row * width + j];
      output_error[row * width + j] = std::abs(weight[j]) * (scale * ex[j] + std::abs(x[j]) * er) +
                                      (r.gamma(3) + 2 * r.store) * std::abs(y);
    }
  }
}

void rmsnorm_backward_error(const double* input, const double* input_error, const double* weight,
                            const double* inverse_rms, const double* inverse_rms_error,
                            const double* output_grad, const double* output_grad_error,
                            std::int64_t rows, std::int64_t width, const Rounding& r,
                            std::int64_t accumulation_terms, double* input_grad,
                            double* input_grad_error, double* weight_grad_error) {
  const double w = static_cast<double>(width);
  const double accumulate = r.gamma(accumulation_terms);
  for (std::int64_t row = 0; row < rows; ++row) {
    const double* x = input + row * width;               // [width]
    const double* ex = input_error + row * width;        // [width]
    const double* dy = output_grad + row * width;        // [width]
    const double* edy = output_grad_error + row * width;  // [width]
    double* dx = input_grad + row * width;                // [width]
    double* edx = input_grad_error + row * width;         // [width]
    const double scale = inverse_rms[row];
    const double er = inverse_rms_error[row];
    // S = sum_j dy_j w_j x_j, its error carried and rounded (gamma_{w+2}, bf16 weights).
    double dot = 0, dot_absolute = 0, dot_error = 0;
    for (std::int64_t j = 0; j < width; ++j) {
      const double aw = std::abs(weight[j]);
      dot += dy[j] * weight[j] * x[j];
      dot_absolute += std::abs(dy[j] * x[j]) * aw;
      dot_error += edy[j] * aw * std::abs(x[j]) + std::abs(dy[j]) * aw * ex[j];
      // dw_j += dy_j x_j r over the global batch.
      weight_grad_error[j] += (edy[j] * std::abs(x[j]) + std::abs(dy[j]) * ex[j]) * scale +
                              std::abs(dy[j] * x[j]) * (er + accumulate * scale);
    }
    dot_error += (r.gamma(width + 2) + r.store) * dot_absolute;
    // C = r^3 S / w.
    const double correction = scale * scale * scale * dot / w;
    const double correction_error =
        (3 * scale * scale * er * std::abs(dot) + scale * scale * scale * dot_error) / w +
        r.gamma(5) * std::abs(correction);
    // dx_k = r w_k dy_k - C x_k, then accumulated into the stream gradient and stored.
    for (std::int64_t k = 0; k < width; ++k) {
      const double aw = std::abs(weight[k]);
      const double direct = scale * weight[k] * dy[k];
      const double contribution = direct - correction * x[k];
      const double carried = er * aw * std::abs(dy[k]) + scale * aw * edy[k] +
                             correction_error * std::abs(x[k]) + std::abs(correction) * ex[k];
      const double own = (r.gamma(4) + r.store) * (std::abs(direct) + std::abs(correction * x[k]));
      edx[k] += carried + own + (r.unit + r.store) * (std::abs(dx[k]) + std::abs(contribution));
      dx[k] += contribution;
    }
  }
}

void rope_table_error(const std::int32_t* positions, std::int64_t rows, std::int64_t head_dim,
                      double base, const Rounding& r, double* table_error) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const double frequency = std::pow(base, static_cast<double>(-2 * i) / static_cast<double>(head_dim));
    for (std::int64_t row = 0; row < rows; ++row) {
      const double angle = std::abs(static_cast<double>(positions[row]) * frequency);
      // cos/sin and the table's store; the angle's error (pow's and the product's, relative to
      // |angle|) reaches cos/sin with slope at most 1.
      table_error[row * half + i] = r.unit * (kLibraryUnits + 2 * kUnitsPerArgument * angle);
    }
  }
}

void rope_error(const double* values, double* error, const double* cosines, const double* sines,
                const double* table_error, std::int64_t rows, std::int64_t heads,
                std::int64_t head_dim, const Rounding& r) {
  // (a, b) -> (a c - b s, b c + a s): e' = |c| e(a) + |s| e(b) + (|a| + |b|) e(table)
  // + (gamma_3 + store) (|a c| + |b s|). The transpose has the same magnitudes.
  const std::int64_t half = head_dim / 2;
  const double own = r.gamma(3) + r.store;
  for (std::int64_t row = 0; row < rows; ++row) {
    for (std::int64_t head = 0; head < heads; ++head) {
      const std::int64_t base = (row * heads + head) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const double c = std::abs(cosines[row * half + i]);
        const double s = std::abs(sines[row * half + i]);
        const double et = table_error[row * half + i];
        const double a = std::abs(values[base + i]);
        const double b = std::abs(values[base + i + half]);
        const double ea = error[base + i];
        const double eb = error[base + i + half];
        error[base + i] = c * ea + s * eb + (a + b) * et + own * (a * c + b * s);
        error[base + i + half] = c * eb + s * ea + (a + b) * et + own * (b * c + a * s);
      }
    }
  }
}

namespace {

// One row of scores over its span, with the reference's softmax magnitudes.
struct ScoreRow {
  std::vector<double> score, score_error;  // [span]
  double max = 0, log_sum_exp = 0, max_distance = 0;  // max_s |z_s - max|
};

}  // namespace

void attention_forward_error(const double* query, const double* query_error, const double* key,
                             const double* key_error, const double* value,
                             const double* value_error, const std::int32_t* attention_start,
                             const AttentionShape& shape, const double* probabilities,
                             const double* context, const Rounding& r,
                             double* probability_error, double* context_error) {
  const std::int64_t rows = shape.rows;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t query_width = shape.heads * hd;
  const std::int64_t kv_width = shape.groups * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  ScoreRow z;
  for (std::int64_t head = 0; head < shape.heads; ++head) {
    const std::int64_t group = head / heads_per_group;
    for (std::int64_t t = 0; t < rows; ++t) {
      const double* q = query + t * query_width + head * hd;         // [hd]
      const double* eq = query_error + t * query_width + head * hd;  // [hd]
      const double* p = probabilities + (head * rows + t) * rows;    // [rows]
      double* ep = probability_error + (head * rows + t) * rows;     // [rows]
      const std::int64_t first = attention_start[t];
      const std::int64_t span = t - first + 1;
      z.score.assign(static_cast<std::size_t>(span), 0.0);
      z.score_error.assign(static_cast<std::size_t>(span), 0.0);
      // z_s = scale q . k_s: carried scale sum (e(q)|k| + |q|e(k)), rounded gamma_{hd+2} on
      // absolute values, plus the scale's own rounding (2u).
      for (std::int64_t s = first; s <= t; ++s) {
        const double* k = key + s * kv_width + group * hd;         // [hd]
        const double* ek = key_error + s * kv_width + group * hd;  // [hd]
        double dot = 0, absolute = 0, carried = 0;
        for (std::int64_t i = 0; i < hd; ++i) {
          dot += q[i] * k[i];
          absolute += std::abs(q[i] * k[i]);
          carried += eq[i] * std::abs(k[i]) + std::abs(q[i]) * ek[i];
        }
        z.score[s - first] = dot * scale;
        z.score_error[s - first] = scale * (carried + (r.gamma(hd + 2) + 2 * r.unit) * absolute);
      }
      z.max = *std::max_element(z.score.begin(), z.score.end());
      double normalizer = 0;
      for (const double score : z.score) normalizer += std::exp(score - z.max);
      z.log_sum_exp = z.max + std::log(normalizer);
      z.max_distance = 0;
      for (const double score : z.score) z.max_distance = std::max(z.max_distance, z.max - score);
      // p_s = softmax: dp_s = p_s (dz_s - sum_r p_r dz_r). Own rounding, relative to p_s: exp of
      // (z_s - max) or (z_s - lse), the normalizer's sum (gamma_{span+2}) and its log, every
      // max-shift of an online softmax (bounded by the largest |z_r - max|).
      double mean_error = 0;
      for (std::int64_t s = first; s <= t; ++s) mean_error += p[s] * z.score_error[s - first];
      for (std::int64_t s = first; s <= t; ++s) {
        const double zs = z.score[s - first];
        const double own = transcendental_error(r, zs - z.max) +
                           transcendental_error(r, zs - z.log_sum_exp) +
                           transcendental_error(r, z.log_sum_exp) +
                           transcendental_error(r, z.max_distance) + 2 * r.gamma(span + 2);
        ep[s] = p[s] * (z.score_error[s - first] + mean_error + own);
      }
      // context = sum_s p_s v_s: carried e(p)|v| + p e(v), rounded gamma_{2 span + 2} (the
      // online softmax's rescalings included), stored (bf16).
      double* ectx = context_error + t * query_width + head * hd;  // [hd]
      const double* ctx = context + t * query_width + head * hd;   // [hd]
      for (std::int64_t i = 0; i < hd; ++i) {
        double carried = 0, absolute = 0;
        for (std::int64_t s = first; s <= t; ++s) {
          const double v = value[s * kv_width + group * hd + i];
          carried += ep[s] * std::abs(v) + p[s] * value_error[s * kv_width + group * hd + i];
          absolute += p[s] * std::abs(v);
        }
        ectx[i] = carried + r.gamma(2 * span + 2) * absolute + (r.unit + r.store) * std::abs(ctx[i]);
      }
    }
  }
}

void attention_backward_error(const double* query, const double* query_error, const double* key,
                              const double* key_error, const double* value,
                              const double* value_error, const std::int32_t* attention_start,
                              const AttentionShape& shape, const double* probabilities,
                              const double* probability_error, const double* context,
                              const double* context_error, const double* context_grad,
                              const double* context_grad_error, const double* query_grad,
                              const double* key_grad, const double* value_grad, const Rounding& r,
                              double* query_grad_error, double* key_grad_error,
                              double* value_grad_error) {
  const std::int64_t rows = shape.rows;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t query_width = shape.heads * hd;
  const std::int64_t kv_width = shape.groups * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // dq sums over a span, dk and dv over rows and the heads of a group: at most rows x H terms.
  const double accumulate = r.gamma(rows * shape.heads + 2);
  std::fill(query_grad_error, query_grad_error + rows * query_width, 0.0);
  std::fill(key_grad_error, key_grad_error + rows * kv_width, 0.0);
  std::fill(value_grad_error, value_grad_error + rows * kv_width, 0.0);
  std::vector<double> dp, edp;  // [span] dp_s = dctx . v_s and its error
  for (std::int64_t head = 0; head < shape.heads; ++head) {
    const std::int64_t group = head / heads_per_group;
    for (std::int64_t t = 0; t < rows; ++t) {
      const std::int64_t row = t * query_width + head * hd;
      const double* q = query + row;
      const double* eq = query_error + row;
      const double* dctx = context_grad + row;
      const double* edctx = context_grad_error + row;
      const double* p = probabilities + (head * rows + t) * rows;
      const double* ep = probability_error + (head * rows + t) * rows;
      const std::int64_t first = attention_start[t];
      const std::int64_t span = t - first + 1;
      dp.assign(static_cast<std::size_t>(span), 0.0);
      edp.assign(static_cast<std::size_t>(span), 0.0);
      // D = sum_s p_s dp_s (the reference) or dctx . context (production): both bounds added.
      double expected = 0, expected_absolute = 0, expected_error = 0;
      for (std::int64_t s = first; s <= t; ++s) {
        const double* v = value + s * kv_width + group * hd;
        const double* ev = value_error + s * kv_width + group * hd;
        double dot = 0, absolute = 0, carried = 0;
        for (std::int64_t i = 0; i < hd; ++i) {
          dot += dctx[i] * v[i];
          absolute += std::abs(dctx[i] * v[i]);
          carried += edctx[i] * std::abs(v[i]) + std::abs(dctx[i]) * ev[i];
        }
        dp[s - first] = dot;
        edp[s - first] = carried + r.gamma(hd + 2) * absolute;
        expected += p[s] * dot;
        expected_absolute += p[s] * std::abs(dot);
        expected_error += ep[s] * std::abs(dot) + p[s] * edp[s - first];
      }
      expected_error += r.gamma(span + 2) * expected_absolute;
      {
        double absolute = 0, carried = 0;
        for (std::int64_t i = 0; i < hd; ++i) {
          absolute += std::abs(dctx[i] * context[row + i]);
          carried += edctx[i] * std::abs(context[row + i]) + std::abs(dctx[i]) * context_error[row + i];
        }
        expected_error += carried + r.gamma(hd + 2) * absolute;
      }
      // dz_s = scale p_s (dp_s - D); dq += dz k, dk += dz q, dv += p dctx.
      for (std::int64_t s = first; s <= t; ++s) {
        const double difference = dp[s - first] - expected;
        const double dz = scale * p[s] * difference;
        const double edz =
            scale * (ep[s] * std::abs(difference) + p[s] * (edp[s - first] + expected_error)) +
            (r.gamma(4) + 2 * r.unit) * scale * p[s] * (std::abs(dp[s - first]) + std::abs(expected));
        const std::int64_t kv = s * kv_width + group * hd;
        for (std::int64_t i = 0; i < hd; ++i) {
          const double k = std::abs(key[kv + i]);
          query_grad_error[row + i] += edz * k + std::abs(dz) * (key_error[kv + i] + accumulate * k);
          key_grad_error[kv + i] +=
              edz * std::abs(q[i]) + std::abs(dz) * (eq[i] + accumulate * std::abs(q[i]));
          value_grad_error[kv + i] += ep[s] * std::abs(dctx[i]) +
                                      p[s] * (edctx[i] + accumulate * std::abs(dctx[i]));
        }
      }
    }
  }
  // Each gradient's store (bf16) and final rounding.
  for (std::int64_t i = 0; i < rows * query_width; ++i) {
    query_grad_error[i] += (r.unit + r.store) * std::abs(query_grad[i]);
  }
  for (std::int64_t i = 0; i < rows * kv_width; ++i) {
    key_grad_error[i] += (r.unit + r.store) * std::abs(key_grad[i]);
    value_grad_error[i] += (r.unit + r.store) * std::abs(value_grad[i]);
  }
}

void swiglu_forward_error(const double* gate, const double* gate_error, const double* up,
                          const double* up_error, std::int64_t count, const Rounding& r,
                          double* hidden_error) {
  // h = silu(g) up: e(h) = |silu'(g) up| e(g) + |silu(g)| e(up) + own. sigma = 1/(1 + exp(-g))
  // rounds by exp's error plus three operations; g sigma up by two more, then the store.
  for (std::int64_t i = 0; i < count; ++i) {
    const double g = gate[i];
    const double sigma = sigmoid(g);
    const double silu = g * sigma;
    const double silu_derivative = sigma * (1 + g * (1 - sigma));
    const double hidden = std::abs(silu * up[i]);
    hidden_error[i] = std::abs(silu_derivative * up[i]) * gate_error[i] + std::abs(silu) * up_error[i] +
                      (transcendental_error(r, g) + r.gamma(6) + r.store) * hidden;
  }
}

void swiglu_backward_error(const double* gate, const double* gate_error, const double* up,
                           const double* up_error, const double* hidden_grad,
                           const double* hidden_grad_error, std::int64_t count, const Rounding& r,
                           double* gate_grad_error, double* up_grad_error) {
  // dgate = dh up silu'(g), dup = dh silu(g); silu'' = sigma (1 - sigma) (2 + g (1 - 2 sigma)).
  for (std::int64_t i = 0; i < count; ++i) {
    const double g = gate[i];
    const double sigma = sigmoid(g);
    const double silu = g * sigma;
    const double first = sigma * (1 + g * (1 - sigma));
    const double second = sigma * (1 - sigma) * (2 + g * (1 - 2 * sigma));
    const double sigma_error = transcendental_error(r, g) + r.gamma(3);  // relative
    // silu' = sigma + g sigma - g sigma^2: sigma's error times (1 + 3|g|), and four operations on
    // the absolute terms.
    const double first_error =
        (1 + 3 * std::abs(g)) * sigma * sigma_error + r.gamma(4) * sigma * (1 + std::abs(g) * (1 + sigma));
    const double dh = std::abs(hidden_grad[i]);
    const double edh = hidden_grad_error[i];
    const double u = std::abs(up[i]);
    gate_grad_error[i] = edh * u * std::abs(first) + dh * up_error[i] * std::abs(first) +
                         dh * u * (std::abs(second) * gate_error[i] + first_error) +
                         (r.gamma(2) + r.store) * dh * u * std::abs(first);
    up_grad_error[i] = edh * std::abs(silu) + dh * std::abs(first) * gate_error[i] +
                       (sigma_error + r.gamma(2) + r.store) * dh * std::abs(silu);
  }
}

double cross_entropy_error(const double* logits, const double* logits_error,
                           const std::int32_t* labels, const std::uint8_t* loss_mask,
                           std::int64_t rows, std::int64_t vocab, double loss_scale,
                           const Rounding& r, double* logits_grad, double* logits_grad_error,
                           double& absolute_loss) {
  std::fill(logits_grad, logits_grad + rows * vocab, 0.0);
  std::fill(logits_grad_error, logits_grad_error + rows * vocab, 0.0);
  double loss_error_sum = 0;
  for (std::int64_t row = 0; row < rows; ++row) {
    if (loss_mask[row] == 0) continue;  // exactly nothing on both sides
    const double* z = logits + row * vocab;        // [vocab]
    const double* ez = logits_error + row * vocab;  // [vocab]
    const double max = *std::max_element(z, z + vocab);
    double normalizer = 0;
    for (std::int64_t c = 0; c < vocab; ++c) normalizer += std::exp(z[c] - max);
    const double log_normalizer = std::log(normalizer);
    const double lse = max + log_normalizer;
    double max_distance = 0, mean_error = 0;
    for (std::int64_t c = 0; c < vocab; ++c) {
      max_distance = std::max(max_distance, max - z[c]);
      mean_error += std::exp(z[c] - lse) * ez[c];
    }
    const std::int32_t label = labels[row];
    const double loss = lse - z[label];
    absolute_loss += std::abs(loss);
    // CE = lse(z) - z_label: carried sum p e(z) + e(z_label); own: the normalizer (gamma_{V+2}
    // and every exp's error, at most the largest shift's), its log, the two additions.
    loss_error_sum += mean_error + ez[label] + 2 * r.gamma(vocab + 2) +
                      transcendental_error(r, max_distance) + transcendental_error(r, log_normalizer) +
                      2 * r.unit * (std::abs(lse) + std::abs(loss));
    // dz_c = scale (p_c - [c = label]): scale's own rounding (2u), the difference and product
    // on absolute values (4u), p's error as in attention_forward_error, the store.
    for (std::int64_t c = 0; c < vocab; ++c) {
      const double p = std::exp(z[c] - lse);
      const double target = c == label ? 1.0 : 0.0;
      const double own = transcendental_error(r, z[c] - max) + transcendental_error(r, z[c] - lse) +
                         transcendental_error(r, lse) + transcendental_error(r, max_distance) +
                         2 * r.gamma(vocab + 2);
      const double ep = p * (ez[c] + mean_error + own);
      const double dz = loss_scale * (p - target);
      logits_grad[row * vocab + c] = dz;
      logits_grad_error[row * vocab + c] =
          loss_scale * ep + 6 * r.unit * loss_scale * (p + target) + r.store * std::abs(dz);
    }
  }
  return loss_error_sum;
}

}  // namespace tandem::equivalence::error_ops
