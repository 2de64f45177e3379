// SwiGLU's product (SPEC 4): hidden = silu(gate) * up, silu(g) = g / (1 + exp(-g)), elementwise,
// and its backward. fp32 inside, one rounding per stored element.
// Host twin in swiglu_host.cpp, CUDA twin in swiglu.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

struct SwigluForwardParams {
  const void* gate = nullptr;   // [count] compute dtype
  const void* up = nullptr;     // [count] compute dtype
  void* hidden = nullptr;       // [count] compute dtype
  std::int64_t count = 0;       // rows * F
  DType dtype = DType::f32;
};

// gate_grad = dh * up * sigma(g) (1 + g (1 - sigma(g))); up_grad = dh * silu(g). Both overwritten.
struct SwigluBackwardParams {
  const void* gate = nullptr;         // [count]
  const void* up = nullptr;           // [count]
  const void* hidden_grad = nullptr;  // [count]
  void* gate_grad = nullptr;          // [count] compute dtype, =
  void* up_grad = nullptr;            // [count] compute dtype, =
  std::int64_t count = 0;
  DType dtype = DType::f32;
};

void swiglu_forward_host(const SwigluForwardParams& params);
void swiglu_backward_host(const SwigluBackwardParams& params);
void swiglu_forward_cuda(const SwigluForwardParams& params, const CudaLaunch& launch);
void swiglu_backward_cuda(const SwigluBackwardParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
