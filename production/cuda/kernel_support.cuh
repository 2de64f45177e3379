// Device-side helpers shared by the CUDA twins in production/kernels/*.cu: compute-typed loads and
// stores with the host's exact bf16 rounding (types.hpp), unfused fp32 arithmetic where a twin
// must round exactly where the host does, launch geometry and workspace checks.
// Only .cu files include this (it needs nvcc); no Boost, no nlohmann/json.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "production/arithmetic.hpp"
#include "production/cuda/check.hpp"
#include "production/kernels/types.hpp"

// TANDEM_LAUNCH(grid, block, shared_bytes, stream, kernel)(arguments...) launches `kernel` as
// kernel<<<grid, block, shared_bytes, stream>>>(arguments...) does: written so for nvcc here, and
// as a call into cuda-sim's engine by cuda_sim/include/cuda_runtime.h when the host compiler builds
// this file for cuda-sim (docs/CUDA-SIM.md). The kernel comes last: its template arguments may hold
// commas.
// TANDEM_DYNAMIC_SHARED(type, name) declares the launch's dynamic shared memory as `type name[]`
// (extern __shared__, 16-byte aligned); cuda-sim gives each block its own buffer of the launch's size.
#if !defined(TANDEM_CUDA_SIM)
#define TANDEM_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define TANDEM_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC::cuda_detail {

// Storage types of compute-typed arrays: float (f32) or Bf16 (the upper half of a binary32).
__device__ __forceinline__ float load(const float* data, std::int64_t index) { return data[index]; }
__device__ __forceinline__ float load(const Bf16* data, std::int64_t index) {
  return __uint_as_float(static_cast<std::uint32_t>(data[index].bits) << 16);
}

// types.hpp's bf16_from_f32, bit for bit (round to nearest even; NaN stays a quiet NaN of the same
// sign), so the cuda and cpu backends store the same bf16 for the same fp32 value.
__device__ __forceinline__ std::uint16_t bf16_bits(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

__device__ __forceinline__ void store(float* data, std::int64_t index, float value) {
  data[index] = value;
}
__device__ __forceinline__ void store(Bf16* data, std::int64_t index, float value) {
  data[index].bits = bf16_bits(value);
}

// Unfused IEEE fp32 operations (nvcc would otherwise contract a*b+c into one FMA, which rounds
// once where the host rounds twice). Used wherever a twin promises the host's exact result.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }

// A block's sum of one value per thread in a fixed tree order (pairs at distance blockDim/2, then
// /4, ...), the same order on every run. blockDim.x must be a power of two <= 1024; `scratch`
// holds blockDim.x values. Every thread gets the total.
template <class Value>
__device__ Value block_sum(Value value, Value* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + stride];
    __syncthreads();
  }
  const Value total = scratch[0];
  __syncthreads();  // scratch may be reused at once
  return total;
}

// A block's maximum (fmaxf: a NaN loses to a number, as std::fmax on the host).
__device__ inline float block_max(float value, float* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();
  return total;
}

// Grid size for `count` items at `per_block` items a block (count > 0).
inline unsigned int blocks_for(std::int64_t count, std::int64_t per_block) {
  const std::int64_t blocks = (count + per_block - 1) / per_block;
  if (blocks > 0x7FFFFFFF) {
    throw std::invalid_argument("cuda launch: " + std::to_string(count) + " items need " +
                                std::to_string(blocks) + " blocks, over the grid's 2^31-1");
  }
  return static_cast<unsigned int>(blocks);
}

// Calls body(T{}) with T = float for DType::f32 and T = Bf16 for DType::bf16: one instantiation of
// a kernel per storage type.
template <class Body>
void with_storage_type(DType dtype, Body&& body) {
  if (dtype == DType::f32) {
    body(float{});
  } else {
    body(Bf16{});
  }
}

inline cudaStream_t stream_of(const CudaLaunch& launch) {
  return static_cast<cudaStream_t>(launch.stream);
}

// The backend's scratch, checked against what an op needs (it names the op and both sizes).
inline void* workspace_of(const CudaLaunch& launch, std::int64_t bytes, const char* op) {
  if (bytes > launch.workspace_bytes || (bytes > 0 && launch.workspace == nullptr)) {
    throw std::invalid_argument(std::string(op) + ": needs " + std::to_string(bytes) +
                                " bytes of workspace, the launch has " +
                                std::to_string(launch.workspace_bytes) +
                                "; fix: a larger cuda backend workspace or smaller microbatches");
  }
  return launch.workspace;
}

}  // namespace tandem::production::cuda_detail
