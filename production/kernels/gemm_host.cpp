// Host twin of the GEMM (gemm.hpp): both operands widened to fp32 into contiguous panels
// (A as [m, k], B as [n, k]), then every C element is one dot product with k increasing.
#include "production/kernels/gemm.hpp"

#include <stdexcept>
#include <vector>

namespace tandem::production {
namespace {

// op(M) as a dense fp32 [rows, depth] panel, whatever M's storage; `transposed_storage` means M
// is stored [depth, rows].
std::vector<float> widen_panel(const GemmOperand& operand, std::int64_t rows, std::int64_t depth,
                               bool transposed_storage) {
  std::vector<float> panel(static_cast<std::size_t>(rows * depth));  // [rows, depth]
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < depth; ++d) {
      const std::int64_t stored = transposed_storage ? d * rows + r : r * depth + d;
      panel[static_cast<std::size_t>(r * depth + d)] = load_as_f32(operand.data, operand.dtype, stored);
    }
  }
  return panel;
}

}  // namespace

void gemm_host(const GemmParams& p) {
  if (p.a.dtype != p.b.dtype) {
    throw std::invalid_argument("gemm: A and B must share a dtype (both f32 or both bf16)");
  }
  // A panel [m, k]: op(A) = A stored [m, k], or A^T with A stored [k, m].
  const std::vector<float> a = widen_panel(p.a, p.m, p.k, p.a.transpose == Transpose::yes);
  // B panel [n, k] (op(B) transposed): op(B) = B stored [k, n] -> transposed storage of [n, k];
  // op(B) = B^T with B stored [n, k] -> plain.
  const std::vector<float> b = widen_panel(p.b, p.n, p.k, p.b.transpose == Transpose::no);
  for (std::int64_t i = 0; i < p.m; ++i) {
    const float* a_row = a.data() + i * p.k;  // [k]
    for (std::int64_t j = 0; j < p.n; ++j) {
      const float* b_row = b.data() + j * p.k;  // [k]
      float sum = 0.0f;
      for (std::int64_t l = 0; l < p.k; ++l) sum += a_row[l] * b_row[l];
      float value = p.alpha * sum;
      if (p.beta != 0.0f) value += p.beta * load_as_f32(p.c, p.c_dtype, i * p.n + j);
      store_from_f32(p.c, p.c_dtype, i * p.n + j, value);
    }
  }
}

}  // namespace tandem::production
