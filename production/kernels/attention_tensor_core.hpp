// The bf16 tensor-core CUDA attention (attention_tensor_core.cu), called by attention.cu's entry
// points when the compute dtype is bf16. Internal to production/kernels: callers use attention.hpp.
#pragma once

#include "production/arithmetic.hpp"
#include "production/kernels/attention.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// dtype must be bf16 and head_dim in [1, 128] (checked; the message names the field).
void attention_forward_tensor_core(const AttentionForwardParams& params, const CudaLaunch& launch);
void attention_backward_tensor_core(const AttentionBackwardParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
