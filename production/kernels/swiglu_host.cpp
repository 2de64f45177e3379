// Host twin of SwiGLU (swiglu.hpp).
#include "production/kernels/swiglu.hpp"

#include <cmath>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void swiglu_forward_host(const SwigluForwardParams& p) {
  for (std::int64_t i = 0; i < p.count; ++i) {
    const Real g = load_as_f32(p.gate, p.dtype, i);
    const Real sigma = 1.0f / (1.0f + std::exp(-g));
    store_from_f32(p.hidden, p.dtype, i, g * sigma * load_as_f32(p.up, p.dtype, i));
  }
}

void swiglu_backward_host(const SwigluBackwardParams& p) {
  // silu(g) = g sigma(g); silu'(g) = sigma(g) (1 + g (1 - sigma(g))).
  for (std::int64_t i = 0; i < p.count; ++i) {
    const Real g = load_as_f32(p.gate, p.dtype, i);
    const Real up = load_as_f32(p.up, p.dtype, i);
    const Real dh = load_as_f32(p.hidden_grad, p.dtype, i);
    const Real sigma = 1.0f / (1.0f + std::exp(-g));
    const Real silu = g * sigma;
    const Real silu_derivative = sigma * (1.0f + g * (1.0f - sigma));
    store_from_f32(p.gate_grad, p.dtype, i, dh * up * silu_derivative);
    store_from_f32(p.up_grad, p.dtype, i, dh * silu);
  }
}

}  // namespace tandem::production
