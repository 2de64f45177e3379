// Token embedding (SPEC 4): forward gathers rows of the compute-typed table; backward adds each
// position's gradient into its token's row of the fp32 main gradient. Host twin in
// embedding_host.cpp, CUDA twin in embedding.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// Vocabulary-parallel (tensor parallelism): the table holds rows [vocab_begin, vocab_begin +
// vocab_rows) of the vocabulary; a token outside them gives a row of zeros (its rank's part of
// the sum over TP ranks), and the backward skips it.
struct EmbeddingForwardParams {
  const std::int32_t* tokens = nullptr;  // [rows], each in [0, vocab)
  const void* table = nullptr;           // [vocab_rows, width] compute dtype
  void* output = nullptr;                // [rows, width] compute dtype (an exact copy of rows)
  std::int64_t rows = 0;
  std::int64_t width = 0;                // d
  DType dtype = DType::f32;              // of table and output
  std::int64_t vocab_begin = 0;          // the table's first vocabulary row
  std::int64_t vocab_rows = -1;          // rows of the table; -1: every token is in it
};

// table_grad[tokens[t] - vocab_begin] += output_grad[t] for t = 0 .. rows-1 whose token is in
// [vocab_begin, vocab_begin + vocab), in increasing t for every token row (the fixed order; the
// CUDA twin groups positions by token, no float atomics).
struct EmbeddingBackwardParams {
  const std::int32_t* tokens = nullptr;  // [rows]
  const void* output_grad = nullptr;     // [rows, width] compute dtype
  Real* table_grad = nullptr;           // [vocab, width] fp32 main gradient, +=
  std::int64_t rows = 0;
  std::int64_t width = 0;
  std::int64_t vocab = 0;                // rows of table_grad (the padded vocabulary, or a TP rank's part)
  DType dtype = DType::f32;              // of output_grad
  std::int64_t vocab_begin = 0;          // table_grad's first vocabulary row
};

void embedding_forward_host(const EmbeddingForwardParams& params);
void embedding_backward_host(const EmbeddingBackwardParams& params);
void embedding_forward_cuda(const EmbeddingForwardParams& params, const CudaLaunch& launch);
void embedding_backward_cuda(const EmbeddingBackwardParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
