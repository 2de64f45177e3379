// What both CUDA attention paths share (attention.cu: fp32 on the CUDA cores; attention_tensor_core.cu:
// bf16 on the tensor cores): the kernel of D = dctx . ctx, and the loads of a query tile's
// attention starts and per-row statistics. Templated on the tile's rows and on the file's own
// Geometry (these read its seq and heads only). Included by .cu files only.
#pragma once

#include <climits>
#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/cuda/kernel_support.cuh"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC::attention_detail {

// D[row, head] = dctx . ctx in fp32, dimensions increasing (the host twin's D_t).
template <class T>
__global__ void context_dot_kernel(const T* context, const T* context_grad, float* dots, std::int64_t rows, int heads,
                                   int head_dim) {
  using cuda_detail::add;
  using cuda_detail::load;
  using cuda_detail::mul;
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * heads) return;
  const std::int64_t base = index * head_dim;  // (row * heads + head) * head_dim
  float sum = 0.0f;
  for (int i = 0; i < head_dim; ++i) sum = add(sum, mul(load(context_grad, base + i), load(context, base + i)));
  dots[index] = sum;
}

// attention_start of rows [first, first + kRows) into starts[] (INT_MAX past seq: nothing
// allowed) and their minimum into *earliest. Needs blockDim.x >= kRows; ends with a barrier.
template <int kRows, class Geometry>
__device__ void load_starts(int* starts, int* earliest, const std::int32_t* attention_start, const Geometry& g,
                            int sample, std::int64_t first) {
  if (threadIdx.x < kRows) {
    const std::int64_t t = first + threadIdx.x;
    starts[threadIdx.x] = t < g.seq ? attention_start[static_cast<std::int64_t>(sample) * g.seq + t] : INT_MAX;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int minimum = INT_MAX;
    for (int row = 0; row < kRows; ++row) minimum = min(minimum, starts[row]);
    *earliest = minimum;
  }
  __syncthreads();
}

// The per-row fp32 statistics (logsumexp or D) of rows [first, first + kRows), one head; zeros
// past seq. No barrier: the caller synchronizes.
template <int kRows, class Geometry>
__device__ void load_row_stats(float* stats, const float* source, const Geometry& g, int sample, std::int64_t first,
                               int head) {
  if (threadIdx.x < kRows) {
    const std::int64_t t = first + threadIdx.x;
    stats[threadIdx.x] = t < g.seq ? source[(static_cast<std::int64_t>(sample) * g.seq + t) * g.heads + head] : 0.0f;
  }
}

}  // namespace tandem::production::attention_detail
