// The update path over flat fp32 ranges (SPEC 6, 7), shaped for a distributed optimizer: a rank
// owns a contiguous range [begin, end) of the flat buffer (core/model_layout.hpp) and calls these
// on its range only. The global norm comes from partial sums: each rank's squared-norm blocks are
// summed in a fixed order, then (DP > 1) all-reduced, then square-rooted.
// Host twins in optimizer_host.cpp, CUDA twins in optimizer.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// Squares summed in double (an fp32 square is exact in double) over fixed blocks:
// block_sums[b] = sum_{i in [b*block, min((b+1)*block, count))} values[i]^2, i increasing inside a
// block on the host; the CUDA twin reduces a block in a fixed tree order. The caller sums the
// blocks in increasing b.
struct SquaredNormParams {
  const Real* values = nullptr;      // [count] a flat fp32 range (main gradients)
  double* block_sums = nullptr;       // [ceil(count / block_elements)] backend memory
  std::int64_t count = 0;
  std::int64_t block_elements = 0;    // > 0; the same on every backend and rank
};
inline std::int64_t squared_norm_blocks(std::int64_t count, std::int64_t block_elements) {
  return (count + block_elements - 1) / block_elements;
}

// A run of consecutive elements of the range that share a decay group (SPEC 7): tensors in the
// flat buffer alternate between decay (matrices) and no_decay (norms, biases).
struct DecaySegment {
  std::int64_t begin = 0;   // first element, relative to the range's start
  std::int64_t count = 0;
  bool decay = true;        // false: weight decay 0 for this segment
};

// Fused AdamW (SPEC 7) over [count] elements, every quantity fp32, then the compute copy:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g g;  m_hat = m / bc1;  v_hat = v / bc2;
//   p = p - lr (m_hat / (sqrt(v_hat) + eps) + wd p)   with wd = 0 outside decay segments;
//   compute_weights = bf16(p) when compute_dtype is bf16 (null and ignored for f32: the fp32
//   compute weights ARE the main weights).
// The hyperparameters are computed in double on the host and rounded to fp32 once (bc = 1 - b^t
// by repeated multiplication, as the reference does).
struct AdamwHyper {
  Real lr = 0.0f;
  Real weight_decay = 0.0f;      // for decay segments
  Real beta1 = 0.9f;
  Real beta2 = 0.999f;
  Real one_minus_beta1 = 0.1f;   // 1 - b1, computed in double
  Real one_minus_beta2 = 0.001f;
  Real eps = 1e-8f;
  Real bias_correction1 = 1.0f;  // 1 - b1^t
  Real bias_correction2 = 1.0f;  // 1 - b2^t
};

struct AdamwParams {
  Real* params = nullptr;             // [count] fp32 main weights
  Real* exp_avg = nullptr;            // [count] fp32 m
  Real* exp_avg_sq = nullptr;         // [count] fp32 v
  const Real* grads = nullptr;        // [count] fp32 main gradients, already clipped
  void* compute_weights = nullptr;     // [count] bf16 copy, or null
  DType compute_dtype = DType::f32;
  std::int64_t count = 0;
  const DecaySegment* segments = nullptr;  // HOST memory, [segment_count], tiling [0, count)
  std::int64_t segment_count = 0;
  AdamwHyper hyper;
};

// values[i] *= factor (fp32), e.g. the clip coefficient (SPEC 6).
struct ScaleParams {
  Real* values = nullptr;  // [count]
  std::int64_t count = 0;
  Real factor = 1.0f;
};

void squared_norm_host(const SquaredNormParams& params);
void adamw_host(const AdamwParams& params);
void scale_host(const ScaleParams& params);
void squared_norm_cuda(const SquaredNormParams& params, const CudaLaunch& launch);
void adamw_cuda(const AdamwParams& params, const CudaLaunch& launch);
void scale_cuda(const ScaleParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
