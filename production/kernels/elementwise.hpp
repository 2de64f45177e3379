// Small elementwise ops of the step: dtype conversion, the residual add, and the linear bias
// (forward add, backward column sums into the fp32 main gradient, --add-bias-linear only).
// Host twins in elementwise_host.cpp, CUDA twins in elementwise.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// output[i] = input[i] converted (f32 -> bf16 rounds to nearest even; bf16 -> f32 is exact).
struct ConvertParams {
  const void* input = nullptr;   // [count] input_dtype
  void* output = nullptr;        // [count] output_dtype
  std::int64_t count = 0;
  DType input_dtype = DType::f32;
  DType output_dtype = DType::bf16;
};

// output[i] = round(a[i] + b[i]) in fp32; output may alias a or b (the residual stream).
struct AddParams {
  const void* a = nullptr;   // [count] compute dtype
  const void* b = nullptr;   // [count] compute dtype
  void* output = nullptr;    // [count] compute dtype
  std::int64_t count = 0;
  DType dtype = DType::f32;
};

// values[row, j] = round(values[row, j] + bias[j]).
struct BiasAddParams {
  void* values = nullptr;        // [rows, width] compute dtype, in place
  const void* bias = nullptr;    // [width] compute dtype
  std::int64_t rows = 0;
  std::int64_t width = 0;
  DType dtype = DType::f32;
};

// bias_grad[j] += sum over rows (increasing) of output_grad[row, j], in fp32.
struct BiasGradParams {
  const void* output_grad = nullptr;  // [rows, width] compute dtype
  Real* bias_grad = nullptr;         // [width] fp32 main gradient, +=
  std::int64_t rows = 0;
  std::int64_t width = 0;
  DType dtype = DType::f32;
};

void convert_host(const ConvertParams& params);
void add_host(const AddParams& params);
void bias_add_host(const BiasAddParams& params);
void bias_grad_host(const BiasGradParams& params);
void convert_cuda(const ConvertParams& params, const CudaLaunch& launch);
void add_cuda(const AddParams& params, const CudaLaunch& launch);
void bias_add_cuda(const BiasAddParams& params, const CudaLaunch& launch);
void bias_grad_cuda(const BiasGradParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
