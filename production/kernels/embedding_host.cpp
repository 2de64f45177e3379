// Host twin of the token embedding (embedding.hpp).
#include "production/kernels/embedding.hpp"

namespace tandem::production {

void embedding_forward_host(const EmbeddingForwardParams& p) {
  for (std::int64_t t = 0; t < p.rows; ++t) {
    const std::int64_t row = p.tokens[t];
    for (std::int64_t j = 0; j < p.width; ++j) {
      // Same dtype in and out: the copy is exact.
      store_from_f32(p.output, p.dtype, t * p.width + j, load_as_f32(p.table, p.dtype, row * p.width + j));
    }
  }
}

void embedding_backward_host(const EmbeddingBackwardParams& p) {
  for (std::int64_t t = 0; t < p.rows; ++t) {
    float* row = p.table_grad + static_cast<std::int64_t>(p.tokens[t]) * p.width;  // [width]
    for (std::int64_t j = 0; j < p.width; ++j) {
      row[j] += load_as_f32(p.output_grad, p.dtype, t * p.width + j);
    }
  }
}

}  // namespace tandem::production
