// Host twin of the masked cross-entropy (cross_entropy.hpp).
#include "production/kernels/cross_entropy.hpp"

#include <cmath>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void cross_entropy_host(const CrossEntropyParams& p) {
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const Real* z = p.logits + row * p.vocab;  // [vocab]
    const std::int64_t base = row * p.vocab;
    if (p.loss_mask[row] == 0) {  // SPEC 5: times the loss mask; exactly nothing
      p.row_losses[row] = 0.0f;
      if (p.logits_grad == nullptr) continue;  // loss only
      for (std::int64_t c = 0; c < p.vocab; ++c) store_from_f32(p.logits_grad, p.grad_dtype, base + c, 0.0f);
      continue;
    }
    Real max_logit = z[0];
    for (std::int64_t c = 1; c < p.vocab; ++c) max_logit = std::fmax(max_logit, z[c]);
    Real normalizer = 0.0f;  // sum_c exp(z_c - max)
    for (std::int64_t c = 0; c < p.vocab; ++c) normalizer += std::exp(z[c] - max_logit);
    const Real log_normalizer = max_logit + std::log(normalizer);
    const std::int32_t label = p.labels[row];
    p.row_losses[row] = log_normalizer - z[label];
    if (p.logits_grad == nullptr) continue;  // loss only
    // Reads z[c] before writing c, so logits_grad may alias logits (f32).
    for (std::int64_t c = 0; c < p.vocab; ++c) {
      const Real probability = std::exp(z[c] - log_normalizer);
      const Real target = c == label ? 1.0f : 0.0f;
      store_from_f32(p.logits_grad, p.grad_dtype, base + c, p.loss_scale * (probability - target));
    }
  }
}

void vocab_parallel_cross_entropy_host(const VocabParallelCrossEntropyParams& p) {
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const Real* z = p.logits + row * p.vocab;  // [vocab]
    const std::int64_t base = row * p.vocab;
    if (p.phase == VocabParallelPhase::local_max) {
      Real max_logit = z[0];
      for (std::int64_t c = 1; c < p.vocab; ++c) max_logit = std::fmax(max_logit, z[c]);
      p.row_stats[row] = max_logit;
      continue;
    }
    Real max_logit = p.maxima[row];
    for (std::int64_t r = 1; r < p.ranks; ++r) max_logit = std::fmax(max_logit, p.maxima[r * p.rows + row]);
    const std::int64_t label = static_cast<std::int64_t>(p.labels[row]) - p.vocab_begin;  // local, if held
    const bool holds_label = label >= 0 && label < p.vocab;
    if (p.phase == VocabParallelPhase::local_sums) {
      Real normalizer = 0.0f;  // sum_c exp(z_c - max) over the local vocabulary
      for (std::int64_t c = 0; c < p.vocab; ++c) normalizer += std::exp(z[c] - max_logit);
      p.row_stats[row] = normalizer;
      p.row_targets[row] = holds_label ? z[label] : 0.0f;
      continue;
    }
    if (p.loss_mask[row] == 0) {  // SPEC 5: times the loss mask; exactly nothing
      p.row_losses[row] = 0.0f;
      if (p.logits_grad == nullptr) continue;
      for (std::int64_t c = 0; c < p.vocab; ++c) store_from_f32(p.logits_grad, p.grad_dtype, base + c, 0.0f);
      continue;
    }
    Real normalizer = p.normalizers[row];
    for (std::int64_t r = 1; r < p.ranks; ++r) normalizer += p.normalizers[r * p.rows + row];
    const Real log_normalizer = max_logit + std::log(normalizer);
    const std::int64_t owner = static_cast<std::int64_t>(p.labels[row]) / p.vocab;
    p.row_losses[row] = log_normalizer - p.targets[owner * p.rows + row];
    if (p.logits_grad == nullptr) continue;  // loss only
    for (std::int64_t c = 0; c < p.vocab; ++c) {
      const Real probability = std::exp(z[c] - log_normalizer);
      const Real target = c == label ? 1.0f : 0.0f;
      store_from_f32(p.logits_grad, p.grad_dtype, base + c, p.loss_scale * (probability - target));
    }
  }
}

}  // namespace tandem::production
