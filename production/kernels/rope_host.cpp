// Host twin of RoPE (rope.hpp).
#include "production/kernels/rope.hpp"

#include <cmath>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void rope_table_host(const RopeTableParams& p) {
  const std::int64_t half = p.head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    // SPEC 4: frequency base^(-2i/hd), in double.
    const double frequency =
        std::pow(p.base, static_cast<double>(-2 * i) / static_cast<double>(p.head_dim));
    for (std::int64_t row = 0; row < p.rows; ++row) {
      const double angle = static_cast<double>(p.positions[row]) * frequency;
      p.cosines[row * half + i] = static_cast<Real>(std::cos(angle));
      p.sines[row * half + i] = static_cast<Real>(std::sin(angle));
    }
  }
}

namespace {

// direction +1: forward rotation; -1: its transpose (the backward).
void rotate(const RopeParams& p, Real direction) {
  const std::int64_t half = p.head_dim / 2;
  const std::int64_t width = p.heads * p.head_dim;
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const Real* c = p.cosines + row * half;  // [hd/2]
    const Real* s = p.sines + row * half;    // [hd/2]
    for (std::int64_t head = 0; head < p.heads; ++head) {
      const std::int64_t base = row * width + head * p.head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const Real first = load_as_f32(p.activations, p.dtype, base + i);
        const Real second = load_as_f32(p.activations, p.dtype, base + i + half);
        const Real sine = direction * s[i];
        store_from_f32(p.activations, p.dtype, base + i, first * c[i] - second * sine);
        store_from_f32(p.activations, p.dtype, base + i + half, second * c[i] + first * sine);
      }
    }
  }
}

}  // namespace

void rope_forward_host(const RopeParams& params) { rotate(params, 1.0f); }
void rope_backward_host(const RopeParams& params) { rotate(params, -1.0f); }

}  // namespace tandem::production
