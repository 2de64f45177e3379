// Host twin of the masked cross-entropy (cross_entropy.hpp).
#include "production/kernels/cross_entropy.hpp"

#include <cmath>

namespace tandem::production {

void cross_entropy_host(const CrossEntropyParams& p) {
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const float* z = p.logits + row * p.vocab;  // [vocab]
    const std::int64_t base = row * p.vocab;
    if (p.loss_mask[row] == 0) {  // SPEC 5: times the loss mask; exactly nothing
      p.row_losses[row] = 0.0f;
      if (p.logits_grad == nullptr) continue;  // loss only
      for (std::int64_t c = 0; c < p.vocab; ++c) store_from_f32(p.logits_grad, p.grad_dtype, base + c, 0.0f);
      continue;
    }
    float max_logit = z[0];
    for (std::int64_t c = 1; c < p.vocab; ++c) max_logit = std::fmax(max_logit, z[c]);
    float normalizer = 0.0f;  // sum_c exp(z_c - max)
    for (std::int64_t c = 0; c < p.vocab; ++c) normalizer += std::exp(z[c] - max_logit);
    const float log_normalizer = max_logit + std::log(normalizer);
    const std::int32_t label = p.labels[row];
    p.row_losses[row] = log_normalizer - z[label];
    if (p.logits_grad == nullptr) continue;  // loss only
    // Reads z[c] before writing c, so logits_grad may alias logits (f32).
    for (std::int64_t c = 0; c < p.vocab; ++c) {
      const float probability = std::exp(z[c] - log_normalizer);
      const float target = c == label ? 1.0f : 0.0f;
      store_from_f32(p.logits_grad, p.grad_dtype, base + c, p.loss_scale * (probability - target));
    }
  }
}

}  // namespace tandem::production
