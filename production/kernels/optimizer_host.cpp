// Host twins of the update path (optimizer.hpp).
#include "production/kernels/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void squared_norm_host(const SquaredNormParams& p) {
  const std::int64_t blocks = squared_norm_blocks(p.count, p.block_elements);
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t end = std::min(p.count, (block + 1) * p.block_elements);
    double sum = 0.0;
    for (std::int64_t i = block * p.block_elements; i < end; ++i) {
      const double value = p.values[i];
      sum += value * value;  // exact square of an fp32 value (rounded once in the semantic build)
    }
    p.block_sums[block] = sum;
  }
}

void adamw_host(const AdamwParams& p) {
  const AdamwHyper& h = p.hyper;
  std::int64_t covered = 0;
  for (std::int64_t segment = 0; segment < p.segment_count; ++segment) {
    const DecaySegment& run = p.segments[segment];
    if (run.begin != covered) {
      throw std::invalid_argument("adamw: decay segments must tile the range in order");
    }
    covered += run.count;
    const Real weight_decay = run.decay ? h.weight_decay : 0.0f;  // SPEC 7
    for (std::int64_t i = run.begin; i < run.begin + run.count; ++i) {
      const Real g = p.grads[i];
      const Real m = h.beta1 * p.exp_avg[i] + h.one_minus_beta1 * g;
      const Real v = h.beta2 * p.exp_avg_sq[i] + h.one_minus_beta2 * g * g;
      const Real m_hat = m / h.bias_correction1;
      const Real v_hat = v / h.bias_correction2;
      const Real param_old = p.params[i];
      const Real param = param_old - h.lr * (m_hat / (std::sqrt(v_hat) + h.eps) + weight_decay * param_old);
      p.exp_avg[i] = m;
      p.exp_avg_sq[i] = v;
      p.params[i] = param;
      if (p.compute_weights != nullptr) store_from_f32(p.compute_weights, p.compute_dtype, i, param);
    }
  }
  if (covered != p.count) {
    throw std::invalid_argument("adamw: decay segments cover " + std::to_string(covered) +
                                " of " + std::to_string(p.count) + " elements");
  }
}

void scale_host(const ScaleParams& p) {
  for (std::int64_t i = 0; i < p.count; ++i) p.values[i] *= p.factor;
}

}  // namespace tandem::production
