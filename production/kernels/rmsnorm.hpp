// RMSNorm (SPEC 4): y = x / sqrt(mean(x^2) + eps) * w, row by row, and its backward. Inside the op
// everything is fp32 (loads widen exactly); only the stores of compute-typed outputs round.
// Host twin in rmsnorm_host.cpp, CUDA twin in rmsnorm.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

struct RmsnormForwardParams {
  const void* input = nullptr;    // [rows, width] compute dtype
  const void* weight = nullptr;   // [width] compute dtype (the compute copy of the norm weight)
  void* output = nullptr;         // [rows, width] compute dtype
  Real* inverse_rms = nullptr;   // [rows] fp32, 1/sqrt(mean(x^2) + eps), kept for the backward
  std::int64_t rows = 0;
  std::int64_t width = 0;         // d
  Real epsilon = 1e-5f;          // --norm-epsilon rounded to fp32
  DType dtype = DType::f32;
};

// With r = inverse_rms[row]: dx_k = r w_k dy_k - r^3 x_k / width * sum_j dy_j w_j x_j;
// dw_j += sum over rows of dy_j x_j r, rows in increasing order (the CUDA twin: fixed-order
// partial sums per row block, then the blocks in order; no float atomics).
struct RmsnormBackwardParams {
  const void* input = nullptr;        // [rows, width] compute dtype, the forward's input
  const void* weight = nullptr;       // [width] compute dtype
  const Real* inverse_rms = nullptr; // [rows] from the forward
  const void* output_grad = nullptr;  // [rows, width] compute dtype
  void* input_grad = nullptr;         // [rows, width] compute dtype
  Real* weight_grad = nullptr;       // [width] fp32 main gradient, +=
  std::int64_t rows = 0;
  std::int64_t width = 0;
  // true: input_grad = round(input_grad + dx) (the residual stream's gradient flows through);
  // false: input_grad = round(dx).
  bool accumulate_input_grad = false;
  DType dtype = DType::f32;
};

void rmsnorm_forward_host(const RmsnormForwardParams& params);
void rmsnorm_backward_host(const RmsnormBackwardParams& params);
void rmsnorm_forward_cuda(const RmsnormForwardParams& params, const CudaLaunch& launch);
void rmsnorm_backward_cuda(const RmsnormBackwardParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
