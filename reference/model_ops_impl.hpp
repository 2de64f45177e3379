// The reference model's operations (reference/model_ops.hpp), their template definitions:
// boring on purpose, every sum accumulated in `Real`. reference/model_ops.cpp instantiates them
// for double and cpp_bin_float_50; equivalence/rounding_probe.cpp for its rounding probe.
#pragma once

#include "reference/model_ops.hpp"

#include <cmath>
#include <vector>

namespace tandem::reference {

// Unqualified math calls below resolve to std:: for double and, by argument-dependent lookup,
// to Boost.Multiprecision's overloads for cpp_bin_float_50. Results are always stored in an
// explicitly typed `Real` (never `auto`), so no expression template outlives its operands.
using std::cos;
using std::exp;
using std::log;
using std::pow;
using std::sin;
using std::sqrt;

template <class Real>
void rmsnorm_forward(const Real* input, const Real* weight, std::int64_t rows, std::int64_t width,
                     const Real& epsilon, Real* output, Real* inverse_rms) {
  for (std::int64_t row = 0; row < rows; ++row) {
    const Real* x = input + row * width;  // [width]
    Real* y = output + row * width;       // [width]
    Real sum_of_squares = 0;
    for (std::int64_t j = 0; j < width; ++j) sum_of_squares += x[j] * x[j];
    const Real mean_square = sum_of_squares / Real(width);
    const Real scale = Real(1) / sqrt(mean_square + epsilon);
    inverse_rms[row] = scale;
    for (std::int64_t j = 0; j < width; ++j) y[j] = x[j] * scale * weight[j];
  }
}

template <class Real>
void rmsnorm_backward(const Real* input, const Real* weight, const Real* inverse_rms,
                      const Real* output_grad, std::int64_t rows, std::int64_t width,
                      Real* input_grad, Real* weight_grad) {
  // y_j = x_j r w_j with r = (mean(x^2) + eps)^(-1/2), dr/dx_k = -r^3 x_k / width, so
  // dx_k = r w_k dy_k - r^3 x_k / width * sum_j dy_j w_j x_j, and dw_j = dy_j x_j r.
  for (std::int64_t row = 0; row < rows; ++row) {
    const Real* x = input + row * width;         // [width]
    const Real* dy = output_grad + row * width;  // [width]
    Real* dx = input_grad + row * width;         // [width]
    const Real r = inverse_rms[row];
    Real weighted_dot = 0;  // sum_j dy_j w_j x_j
    for (std::int64_t j = 0; j < width; ++j) {
      weighted_dot += dy[j] * weight[j] * x[j];
      weight_grad[j] += dy[j] * x[j] * r;
    }
    const Real correction = r * r * r * weighted_dot / Real(width);
    for (std::int64_t k = 0; k < width; ++k) dx[k] += r * weight[k] * dy[k] - correction * x[k];
  }
}

template <class Real>
void linear_forward(const Real* input, const Real* weight, const Real* bias, std::int64_t rows,
                    std::int64_t in_features, std::int64_t out_features, Real* output) {
  for (std::int64_t row = 0; row < rows; ++row) {
    const Real* x = input + row * in_features;  // [in]
    Real* y = output + row * out_features;      // [out]
    for (std::int64_t out = 0; out < out_features; ++out) {
      const Real* w = weight + out * in_features;  // [in]
      Real sum = bias != nullptr ? bias[out] : Real(0);
      for (std::int64_t in = 0; in < in_features; ++in) sum += x[in] * w[in];
      y[out] = sum;
    }
  }
}

template <class Real>
void linear_backward(const Real* input, const Real* weight, const Real* output_grad,
                     std::int64_t rows, std::int64_t in_features, std::int64_t out_features,
                     Real* input_grad, Real* weight_grad, Real* bias_grad) {
  // dx = dy W, dW = dy^T x, db = column sums of dy; loops ordered so the inner one is contiguous.
  for (std::int64_t row = 0; row < rows; ++row) {
    const Real* x = input + row * in_features;          // [in]
    const Real* dy = output_grad + row * out_features;  // [out]
    for (std::int64_t out = 0; out < out_features; ++out) {
      const Real upstream = dy[out];
      if (upstream == 0) continue;  // exact: adds nothing (masked rows, skipped positions)
      const Real* w = weight + out * in_features;  // [in]
      Real* dw = weight_grad + out * in_features;  // [in]
      if (input_grad != nullptr) {
        Real* dx = input_grad + row * in_features;  // [in]
        for (std::int64_t in = 0; in < in_features; ++in) dx[in] += upstream * w[in];
      }
      for (std::int64_t in = 0; in < in_features; ++in) dw[in] += upstream * x[in];
      if (bias_grad != nullptr) bias_grad[out] += upstream;
    }
  }
}

template <class Real>
void rope_tables(const std::int32_t* positions, std::int64_t rows, std::int64_t head_dim,
                 const Real& base, Real* cosines, Real* sines) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    // SPEC 4: frequency base^(-2i/hd).
    const Real frequency = pow(base, Real(-2 * i) / Real(head_dim));
    for (std::int64_t row = 0; row < rows; ++row) {
      const Real angle = Real(positions[row]) * frequency;
      cosines[row * half + i] = cos(angle);
      sines[row * half + i] = sin(angle);
    }
  }
}

template <class Real>
void rope_forward(Real* activations, const Real* cosines, const Real* sines, std::int64_t rows,
                  std::int64_t heads, std::int64_t head_dim) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t row = 0; row < rows; ++row) {
    const Real* c = cosines + row * half;  // [hd/2]
    const Real* s = sines + row * half;    // [hd/2]
    for (std::int64_t head = 0; head < heads; ++head) {
      Real* x = activations + (row * heads + head) * head_dim;  // [hd]
      for (std::int64_t i = 0; i < half; ++i) {
        const Real first = x[i];
        const Real second = x[i + half];
        x[i] = first * c[i] - second * s[i];
        x[i + half] = second * c[i] + first * s[i];
      }
    }
  }
}

template <class Real>
void rope_backward(Real* gradients, const Real* cosines, const Real* sines, std::int64_t rows,
                   std::int64_t heads, std::int64_t head_dim) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t row = 0; row < rows; ++row) {
    const Real* c = cosines + row * half;  // [hd/2]
    const Real* s = sines + row * half;    // [hd/2]
    for (std::int64_t head = 0; head < heads; ++head) {
      Real* g = gradients + (row * heads + head) * head_dim;  // [hd]
      for (std::int64_t i = 0; i < half; ++i) {
        const Real first = g[i];
        const Real second = g[i + half];
        g[i] = first * c[i] + second * s[i];
        g[i + half] = second * c[i] - first * s[i];
      }
    }
  }
}

template <class Real>
void attention_forward(const Real* query, const Real* key, const Real* value,
                       const std::int32_t* attention_start, const AttentionShape& shape,
                       Real* probabilities, Real* context) {
  const std::int64_t rows = shape.rows;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t query_width = shape.heads * hd;  // H*hd
  const std::int64_t kv_width = shape.groups * hd;    // G*hd
  const Real scale = Real(1) / sqrt(Real(hd));        // SPEC 4: 1/sqrt(hd)
  for (std::int64_t head = 0; head < shape.heads; ++head) {
    const std::int64_t group = head / heads_per_group;  // SPEC 4: GQA, Hugging Face's repeat_kv
    for (std::int64_t t = 0; t < rows; ++t) {
      const Real* q = query + t * query_width + head * hd;        // [hd]
      Real* p = probabilities + (head * rows + t) * rows;         // [rows], span entries only
      Real* out = context + t * query_width + head * hd;          // [hd]
      const std::int64_t first = attention_start[t];
      // Scores over the span, then a softmax shifted by the span's maximum.
      Real max_score = 0;
      for (std::int64_t s = first; s <= t; ++s) {
        const Real* k = key + s * kv_width + group * hd;  // [hd]
        Real dot = 0;
        for (std::int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
        p[s] = dot * scale;
        if (s == first || p[s] > max_score) max_score = p[s];
      }
      Real normalizer = 0;
      for (std::int64_t s = first; s <= t; ++s) {
        p[s] = exp(p[s] - max_score);
        normalizer += p[s];
      }
      for (std::int64_t i = 0; i < hd; ++i) out[i] = 0;
      for (std::int64_t s = first; s <= t; ++s) {
        p[s] /= normalizer;
        const Real* v = value + s * kv_width + group * hd;  // [hd]
        for (std::int64_t i = 0; i < hd; ++i) out[i] += p[s] * v[i];
      }
    }
  }
}

template <class Real>
void attention_backward(const Real* query, const Real* key, const Real* value,
                        const std::int32_t* attention_start, const AttentionShape& shape,
                        const Real* probabilities, const Real* context_grad, Real* query_grad,
                        Real* key_grad, Real* value_grad) {
  // context_t = sum_s p_ts v_s          => dv_s += p_ts dctx_t, dp_ts = dctx_t . v_s
  // p_t = softmax(z_t) over the span    => dz_ts = p_ts (dp_ts - sum_s' p_ts' dp_ts')
  // z_ts = scale q_t . k_s              => dq_t += scale sum_s dz_ts k_s, dk_s += scale dz_ts q_t
  const std::int64_t rows = shape.rows;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t query_width = shape.heads * hd;
  const std::int64_t kv_width = shape.groups * hd;
  const Real scale = Real(1) / sqrt(Real(hd));
  std::vector<Real> probability_grad(static_cast<std::size_t>(rows));  // [rows] dp_t over the span
  for (std::int64_t head = 0; head < shape.heads; ++head) {
    const std::int64_t group = head / heads_per_group;
    for (std::int64_t t = 0; t < rows; ++t) {
      const Real* q = query + t * query_width + head * hd;          // [hd]
      const Real* p = probabilities + (head * rows + t) * rows;     // [rows]
      const Real* dctx = context_grad + t * query_width + head * hd;  // [hd]
      Real* dq = query_grad + t * query_width + head * hd;          // [hd]
      const std::int64_t first = attention_start[t];
      for (std::int64_t s = first; s <= t; ++s) {
        const Real* v = value + s * kv_width + group * hd;  // [hd]
        Real* dv = value_grad + s * kv_width + group * hd;  // [hd]
        Real dot = 0;
        for (std::int64_t i = 0; i < hd; ++i) {
          dot += dctx[i] * v[i];
          dv[i] += p[s] * dctx[i];
        }
        probability_grad[static_cast<std::size_t>(s)] = dot;
      }
      const Real expected_grad = attention_expected_grad(p, probability_grad.data(), first, t, dctx,
                                                         value + group * hd, kv_width, hd);  // D_t
      for (std::int64_t s = first; s <= t; ++s) {
        const Real score_grad = p[s] * (probability_grad[static_cast<std::size_t>(s)] - expected_grad) * scale;
        const Real* k = key + s * kv_width + group * hd;  // [hd]
        Real* dk = key_grad + s * kv_width + group * hd;  // [hd]
        for (std::int64_t i = 0; i < hd; ++i) {
          dq[i] += score_grad * k[i];
          dk[i] += score_grad * q[i];
        }
      }
    }
  }
}

namespace {

template <class Real>
Real sigmoid(const Real& x) {
  return Real(1) / (Real(1) + exp(-x));
}

}  // namespace

template <class Real>
void swiglu_forward(const Real* gate, const Real* up, std::int64_t count, Real* hidden) {
  for (std::int64_t i = 0; i < count; ++i) hidden[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

template <class Real>
void swiglu_backward(const Real* gate, const Real* up, const Real* hidden_grad, std::int64_t count,
                     Real* gate_grad, Real* up_grad) {
  // silu(g) = g sigma(g); silu'(g) = sigma(g) (1 + g (1 - sigma(g))).
  for (std::int64_t i = 0; i < count; ++i) {
    const Real sigma = sigmoid(gate[i]);
    const Real silu = gate[i] * sigma;
    const Real silu_derivative = sigma * (Real(1) + gate[i] * (Real(1) - sigma));
    gate_grad[i] += hidden_grad[i] * up[i] * silu_derivative;
    up_grad[i] += hidden_grad[i] * silu;
  }
}

template <class Real>
Real cross_entropy_forward_backward(const Real* logits, const std::int32_t* labels,
                                    const std::uint8_t* loss_mask, std::int64_t rows,
                                    std::int64_t vocab, const Real& loss_scale, Real* logits_grad) {
  Real masked_loss_sum = 0;
  for (std::int64_t row = 0; row < rows; ++row) {
    if (loss_mask[row] == 0) continue;  // SPEC 5: times the loss mask; exactly nothing
    const Real* z = logits + row * vocab;  // [vocab]
    Real max_logit = z[0];
    for (std::int64_t c = 1; c < vocab; ++c) {
      if (z[c] > max_logit) max_logit = z[c];
    }
    Real normalizer = 0;  // sum_c exp(z_c - max)
    for (std::int64_t c = 0; c < vocab; ++c) normalizer += exp(z[c] - max_logit);
    const Real log_normalizer = max_logit + log(normalizer);
    const Real row_loss = log_normalizer - z[labels[row]];
    add_to_loss_sum(masked_loss_sum, row_loss);
    if (logits_grad != nullptr) {
      Real* dz = logits_grad + row * vocab;  // [vocab]
      for (std::int64_t c = 0; c < vocab; ++c) dz[c] += loss_scale * exp(z[c] - log_normalizer);
      dz[labels[row]] -= loss_scale;
    }
  }
  return masked_loss_sum;
}

// Explicit instantiations of every operation for one scalar type (reference/model_ops.cpp).
#define TANDEM_INSTANTIATE_MODEL_OPS(Real)                                                          \
  template void rmsnorm_forward<Real>(const Real*, const Real*, std::int64_t, std::int64_t,         \
                                      const Real&, Real*, Real*);                                   \
  template void rmsnorm_backward<Real>(const Real*, const Real*, const Real*, const Real*,          \
                                       std::int64_t, std::int64_t, Real*, Real*);                   \
  template void linear_forward<Real>(const Real*, const Real*, const Real*, std::int64_t,           \
                                     std::int64_t, std::int64_t, Real*);                            \
  template void linear_backward<Real>(const Real*, const Real*, const Real*, std::int64_t,          \
                                      std::int64_t, std::int64_t, Real*, Real*, Real*);             \
  template void rope_tables<Real>(const std::int32_t*, std::int64_t, std::int64_t, const Real&,     \
                                  Real*, Real*);                                                    \
  template void rope_forward<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t,     \
                                   std::int64_t);                                                   \
  template void rope_backward<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t,    \
                                    std::int64_t);                                                  \
  template void attention_forward<Real>(const Real*, const Real*, const Real*, const std::int32_t*, \
                                        const AttentionShape&, Real*, Real*);                       \
  template void attention_backward<Real>(const Real*, const Real*, const Real*,                     \
                                         const std::int32_t*, const AttentionShape&, const Real*,   \
                                         const Real*, Real*, Real*, Real*);                         \
  template void swiglu_forward<Real>(const Real*, const Real*, std::int64_t, Real*);                \
  template void swiglu_backward<Real>(const Real*, const Real*, const Real*, std::int64_t, Real*,   \
                                      Real*);                                                       \
  template Real cross_entropy_forward_backward<Real>(const Real*, const std::int32_t*,              \
                                                     const std::uint8_t*, std::int64_t,             \
                                                     std::int64_t, const Real&, Real*);


}  // namespace tandem::reference
