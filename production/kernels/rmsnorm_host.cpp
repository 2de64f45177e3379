// Host twin of RMSNorm (rmsnorm.hpp): fp32 inside, sums in increasing index order.
#include "production/kernels/rmsnorm.hpp"

#include <cmath>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void rmsnorm_forward_host(const RmsnormForwardParams& p) {
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const std::int64_t base = row * p.width;
    Real sum_of_squares = 0.0f;
    for (std::int64_t j = 0; j < p.width; ++j) {
      const Real x = load_as_f32(p.input, p.dtype, base + j);
      sum_of_squares += x * x;
    }
    const Real mean_square = sum_of_squares / static_cast<Real>(p.width);
    const Real scale = 1.0f / std::sqrt(mean_square + p.epsilon);
    p.inverse_rms[row] = scale;
    for (std::int64_t j = 0; j < p.width; ++j) {
      const Real x = load_as_f32(p.input, p.dtype, base + j);
      store_from_f32(p.output, p.dtype, base + j, x * scale * load_as_f32(p.weight, p.dtype, j));
    }
  }
}

void rmsnorm_backward_host(const RmsnormBackwardParams& p) {
  const Real width = static_cast<Real>(p.width);
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const std::int64_t base = row * p.width;
    const Real r = p.inverse_rms[row];
    Real weighted_dot = 0.0f;  // sum_j dy_j w_j x_j
    for (std::int64_t j = 0; j < p.width; ++j) {
      const Real x = load_as_f32(p.input, p.dtype, base + j);
      const Real dy = load_as_f32(p.output_grad, p.dtype, base + j);
      weighted_dot += dy * load_as_f32(p.weight, p.dtype, j) * x;
      p.weight_grad[j] += dy * x * r;
    }
    const Real correction = r * r * r * weighted_dot / width;
    for (std::int64_t k = 0; k < p.width; ++k) {
      const Real x = load_as_f32(p.input, p.dtype, base + k);
      const Real dy = load_as_f32(p.output_grad, p.dtype, base + k);
      Real dx = r * load_as_f32(p.weight, p.dtype, k) * dy - correction * x;
      if (p.accumulate_input_grad) dx += load_as_f32(p.input_grad, p.dtype, base + k);
      store_from_f32(p.input_grad, p.dtype, base + k, dx);
    }
  }
}

}  // namespace tandem::production
