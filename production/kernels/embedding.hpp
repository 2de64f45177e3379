// Token embedding (SPEC 4): forward gathers rows of the compute-typed table; backward adds each
// position's gradient into its token's row of the fp32 main gradient. Host twin in
// embedding_host.cpp, CUDA twin in embedding.cu.
#pragma once

#include <cstdint>

#include "production/kernels/types.hpp"

namespace tandem::production {

struct EmbeddingForwardParams {
  const std::int32_t* tokens = nullptr;  // [rows], each in [0, vocab)
  const void* table = nullptr;           // [vocab, width] compute dtype
  void* output = nullptr;                // [rows, width] compute dtype (an exact copy of rows)
  std::int64_t rows = 0;
  std::int64_t width = 0;                // d
  DType dtype = DType::f32;              // of table and output
};

// table_grad[tokens[t]] += output_grad[t] for t = 0 .. rows-1, in increasing t for every token
// row (the fixed order; the CUDA twin groups positions by token, no float atomics).
struct EmbeddingBackwardParams {
  const std::int32_t* tokens = nullptr;  // [rows]
  const void* output_grad = nullptr;     // [rows, width] compute dtype
  float* table_grad = nullptr;           // [vocab, width] fp32 main gradient, +=
  std::int64_t rows = 0;
  std::int64_t width = 0;
  std::int64_t vocab = 0;                // padded vocabulary (rows of table_grad)
  DType dtype = DType::f32;              // of output_grad
};

void embedding_forward_host(const EmbeddingForwardParams& params);
void embedding_backward_host(const EmbeddingBackwardParams& params);
void embedding_forward_cuda(const EmbeddingForwardParams& params, const CudaLaunch& launch);
void embedding_backward_cuda(const EmbeddingBackwardParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
