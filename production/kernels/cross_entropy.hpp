// Masked cross-entropy over the padded vocabulary (SPEC 5), forward and backward in one pass over
// a CHUNK of rows: the trainer computes fp32 logits for `rows` positions at a time (GEMM), calls
// this, and runs the output projection's backward on the chunk, so the fp32 logits of a whole
// microbatch never exist at once. Host twin in cross_entropy_host.cpp, CUDA twin in
// cross_entropy.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// For a row with loss_mask 1: lse = max + log(sum_c exp(z_c - max)) in fp32,
// row_losses[t] = lse - z[label], logits_grad[t, c] = loss_scale * (exp(z_c - lse) - [c == label]).
// For a row with loss_mask 0: row_losses[t] = 0 and logits_grad[t, :] = 0 (SPEC 5: times the mask).
// The trainer sums row_losses in double, in row order (the masked CE sum, deterministic).
// Loss only (evaluation, docs/DATA.md section 12): logits_grad = nullptr writes row_losses alone,
// the same values bit for bit as with a gradient, and never touches a gradient.
struct CrossEntropyParams {
  const Real* logits = nullptr;            // [rows, vocab] fp32
  const std::int32_t* labels = nullptr;     // [rows], in [0, vocab)
  const std::uint8_t* loss_mask = nullptr;  // [rows], 0 or 1
  Real* row_losses = nullptr;              // [rows] fp32
  void* logits_grad = nullptr;              // [rows, vocab] grad_dtype; may alias logits for f32;
                                            // nullptr: loss only
  std::int64_t rows = 0;
  std::int64_t vocab = 0;                   // padded vocabulary V
  Real loss_scale = 0.0f;                  // SPEC 5: 1/(global loss tokens) for per-token
  DType grad_dtype = DType::f32;            // the compute dtype (the backward GEMMs' input)
};

// The vocabulary-parallel masked cross-entropy of tensor parallelism (Megatron's
// VocabParallelCrossEntropy; production/tensor_parallel.hpp): each of `ranks` TP ranks holds the
// fp32 logits of its vocabulary rows [vocab_begin, vocab_begin + vocab) for a chunk of rows, and
// the full logits never exist anywhere. Three phases, the trainer's all-gathers between them
// ([ranks, rows], rank order):
//   local_max:  row_stats[t] = max_c z[t, c] over the local vocabulary (fmax, c increasing);
//   local_sums: M_t = the maximum of maxima[., t]; row_stats[t] = sum_c exp(z[t, c] - M_t) in fp32,
//               c increasing; row_targets[t] = z[t, label - vocab_begin] when this rank holds the
//               label, else 0;
//   finish:     S_t = ((normalizers[0, t] + normalizers[1, t]) + ...) in fp32; lse = M_t + log(S_t);
//               row_losses[t] = lse - targets[owner, t] (owner: the rank holding the label);
//               logits_grad[t, c] = loss_scale * (exp(z[t, c] - lse) - [c == label - vocab_begin]);
//               rows with loss_mask 0: row_losses 0 and logits_grad 0; logits_grad = nullptr: loss
//               only, as cross_entropy.
// With ranks = 1 the host twin computes cross_entropy_host's values bit for bit.
enum class VocabParallelPhase { local_max, local_sums, finish };

struct VocabParallelCrossEntropyParams {
  VocabParallelPhase phase = VocabParallelPhase::local_max;
  const Real* logits = nullptr;            // [rows, vocab] fp32, this rank's vocabulary rows
  const std::int32_t* labels = nullptr;     // [rows], in [0, vocab x ranks)
  const std::uint8_t* loss_mask = nullptr;  // [rows]
  std::int64_t rows = 0;
  std::int64_t vocab = 0;                   // this rank's vocabulary rows
  std::int64_t vocab_begin = 0;             // its first
  std::int64_t ranks = 1;                   // TP
  const Real* maxima = nullptr;            // [ranks, rows] local_max's outputs (local_sums, finish)
  const Real* normalizers = nullptr;       // [ranks, rows] local_sums' row_stats (finish)
  const Real* targets = nullptr;           // [ranks, rows] local_sums' row_targets (finish)
  Real* row_stats = nullptr;               // [rows] out: local_max, local_sums
  Real* row_targets = nullptr;             // [rows] out: local_sums
  Real* row_losses = nullptr;              // [rows] out: finish
  void* logits_grad = nullptr;              // [rows, vocab] grad_dtype, may alias logits (f32)
  Real loss_scale = 0.0f;
  DType grad_dtype = DType::f32;
};

void cross_entropy_host(const CrossEntropyParams& params);
void cross_entropy_cuda(const CrossEntropyParams& params, const CudaLaunch& launch);
void vocab_parallel_cross_entropy_host(const VocabParallelCrossEntropyParams& params);
void vocab_parallel_cross_entropy_cuda(const VocabParallelCrossEntropyParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
