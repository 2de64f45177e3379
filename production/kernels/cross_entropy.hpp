// Masked cross-entropy over the padded vocabulary (SPEC 5), forward and backward in one pass over
// a CHUNK of rows: the trainer computes fp32 logits for `rows` positions at a time (GEMM), calls
// this, and runs the output projection's backward on the chunk, so the fp32 logits of a whole
// microbatch never exist at once. Host twin in cross_entropy_host.cpp, CUDA twin in
// cross_entropy.cu.
#pragma once

#include <cstdint>

#include "production/kernels/types.hpp"

namespace tandem::production {

// For a row with loss_mask 1: lse = max + log(sum_c exp(z_c - max)) in fp32,
// row_losses[t] = lse - z[label], logits_grad[t, c] = loss_scale * (exp(z_c - lse) - [c == label]).
// For a row with loss_mask 0: row_losses[t] = 0 and logits_grad[t, :] = 0 (SPEC 5: times the mask).
// The trainer sums row_losses in double, in row order (the masked CE sum, deterministic).
// Loss only (evaluation, docs/DATA.md section 12): logits_grad = nullptr writes row_losses alone,
// the same values bit for bit as with a gradient, and never touches a gradient.
struct CrossEntropyParams {
  const float* logits = nullptr;            // [rows, vocab] fp32
  const std::int32_t* labels = nullptr;     // [rows], in [0, vocab)
  const std::uint8_t* loss_mask = nullptr;  // [rows], 0 or 1
  float* row_losses = nullptr;              // [rows] fp32
  void* logits_grad = nullptr;              // [rows, vocab] grad_dtype; may alias logits for f32;
                                            // nullptr: loss only
  std::int64_t rows = 0;
  std::int64_t vocab = 0;                   // padded vocabulary V
  float loss_scale = 0.0f;                  // SPEC 5: 1/(global loss tokens) for per-token
  DType grad_dtype = DType::f32;            // the compute dtype (the backward GEMMs' input)
};

void cross_entropy_host(const CrossEntropyParams& params);
void cross_entropy_cuda(const CrossEntropyParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
