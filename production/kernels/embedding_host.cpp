// Host twin of the token embedding (embedding.hpp).
#include "production/kernels/embedding.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void embedding_forward_host(const EmbeddingForwardParams& p) {
  for (std::int64_t t = 0; t < p.rows; ++t) {
    const std::int64_t row = p.tokens[t] - p.vocab_begin;
    if (p.vocab_rows >= 0 && (row < 0 || row >= p.vocab_rows)) {  // another rank's row: zeros
      for (std::int64_t j = 0; j < p.width; ++j) store_from_f32(p.output, p.dtype, t * p.width + j, 0.0f);
      continue;
    }
    for (std::int64_t j = 0; j < p.width; ++j) {
      // Same dtype in and out: the copy is exact.
      store_from_f32(p.output, p.dtype, t * p.width + j, load_as_f32(p.table, p.dtype, row * p.width + j));
    }
  }
}

void embedding_backward_host(const EmbeddingBackwardParams& p) {
  for (std::int64_t t = 0; t < p.rows; ++t) {
    const std::int64_t token = static_cast<std::int64_t>(p.tokens[t]) - p.vocab_begin;
    if (token < 0 || token >= p.vocab) continue;  // another rank's row
    Real* row = p.table_grad + token * p.width;  // [width]
    for (std::int64_t j = 0; j < p.width; ++j) {
      row[j] += load_as_f32(p.output_grad, p.dtype, t * p.width + j);
    }
  }
}

}  // namespace tandem::production
