// CUDA twins of the update path (optimizer.hpp). Memory-bound: where the bases are 16-byte aligned
// they move 16 bytes a load and store (float4), element ranges that do not fill a vector take the
// scalar path; the arithmetic per element is the same either way.
//   squared_norm: one block of kNormThreads per block of `block_elements`; thread x sums, in
//     double, the squares of elements x, x + kNormThreads, x + 2 kNormThreads, ... of its block in
//     increasing order, then the block adds the threads' sums in a fixed tree (pairs at distance
//     256, 128, ..., 1). The elements reach shared memory in float4 chunks first (adding the +0.0
//     of a zero past the end leaves a sum of squares unchanged), and the tree's last five levels
//     run on warp shuffles with the same pairs: the result bits do not depend on either. No
//     atomics; the same answer every run. Differs from the host's sequential order only in
//     rounding of double sums (the squares themselves are exact in double).
//   adamw: one thread per 4 consecutive elements, SPEC 7's expression with the host's exact
//     operation order and roundings (unfused fp32, correctly rounded sqrt and division), so the
//     twins agree bit for bit; the decay segments (host memory) travel by value in the launch,
//     kMaxSegments per launch.
//   scale: one thread per 4 elements, exact.
#include <algorithm>
#include <cstdint>

#include "production/cuda/kernel_support.cuh"
#include "production/kernels/optimizer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;
constexpr int kNormThreads = 512;
constexpr int kMaxSegments = 64;

constexpr int kNormChunk = 4 * kNormThreads;  // elements staged in shared memory at a time

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Sum of one double per thread over kNormThreads threads in the fixed tree of block_sum (pairs at
// distance kNormThreads/2, then /4, ...): through shared memory down to distance 32, then on warp
// 0's shuffles (lane x adds lane x + distance's value, as scratch[x] + scratch[x + distance]).
// The total is valid in thread 0.
__device__ double norm_block_sum(double value, double* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned int stride = kNormThreads / 2; stride >= 32; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + stride];
    __syncthreads();
  }
  double total = 0.0;
  if (threadIdx.x < 32) {
    total = scratch[threadIdx.x];
    for (unsigned int stride = 16; stride > 0; stride /= 2) total = total + __shfl_down_sync(0xFFFFFFFFu, total, stride);
  }
  return total;
}

__global__ void __launch_bounds__(kNormThreads) squared_norm_kernel(const float* values, double* block_sums,
                                                                    std::int64_t count, std::int64_t block_elements,
                                                                    bool vector_loads) {
  __shared__ double scratch[kNormThreads];
  __shared__ __align__(16) float chunk[kNormChunk];
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * block_elements;
  const std::int64_t end = begin + block_elements < count ? begin + block_elements : count;
  double sum = 0.0;
  for (std::int64_t chunk_begin = begin; chunk_begin < end; chunk_begin += kNormChunk) {
    // Stage [chunk_begin, chunk_begin + kNormChunk) with zeros past `end`.
    const std::int64_t first = chunk_begin + 4 * static_cast<std::int64_t>(threadIdx.x);
    float4 four = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (vector_loads && first + 4 <= end) {
      four = *reinterpret_cast<const float4*>(values + first);
    } else {
      if (first + 0 < end) four.x = values[first + 0];
      if (first + 1 < end) four.y = values[first + 1];
      if (first + 2 < end) four.z = values[first + 2];
      if (first + 3 < end) four.w = values[first + 3];
    }
    *reinterpret_cast<float4*>(chunk + 4 * threadIdx.x) = four;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const double value = chunk[threadIdx.x + j * kNormThreads];
      sum += value * value;  // exact square of an fp32 value
    }
    __syncthreads();
  }
  const double total = norm_block_sum(sum, scratch);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

// Segments [first, first + count) of the range as one launch's argument: the element range they
// tile, each segment's end relative to `begin`, and its decay flag.
struct SegmentBatch {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  int segments = 0;
  std::int64_t ends[kMaxSegments] = {};
  bool decay[kMaxSegments] = {};
};

// The decay flag of the element `offset` past batch.begin: the first segment whose end lies past
// it (binary search: at most 6 steps for 64).
__device__ __forceinline__ bool decays(const SegmentBatch& batch, std::int64_t offset) {
  int low = 0, high = batch.segments - 1;
  while (low < high) {
    const int middle = (low + high) / 2;
    if (offset < batch.ends[middle]) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  return batch.decay[low];
}

// SPEC 7 for one element, in the host twin's operation order and roundings.
__device__ __forceinline__ void adamw_element(float& param, float& exp_avg, float& exp_avg_sq, float g,
                                              float weight_decay, const AdamwHyper& h) {
  const float m = add(mul(h.beta1, exp_avg), mul(h.one_minus_beta1, g));
  const float v = add(mul(h.beta2, exp_avg_sq), mul(mul(h.one_minus_beta2, g), g));
  const float m_hat = div(m, h.bias_correction1);
  const float v_hat = div(v, h.bias_correction2);
  const float param_old = param;
  const float step = add(div(m_hat, add(sqrt_rn(v_hat), h.eps)), mul(weight_decay, param_old));
  param = sub(param_old, mul(h.lr, step));
  exp_avg = m;
  exp_avg_sq = v;
}

// Thread k updates elements [first, first + 4), first = 4 floor(batch.begin / 4) + 4k, those of
// them inside the batch: one float4 per array when all four are and the bases are aligned.
template <class Compute>
__global__ void adamw_kernel(float* params, float* exp_avg, float* exp_avg_sq, const float* grads,
                             Compute* compute_weights, SegmentBatch batch, AdamwHyper h, bool vector_loads) {
  const std::int64_t end = batch.begin + batch.count;
  const std::int64_t first =
      (batch.begin / 4) * 4 + 4 * (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (first >= end) return;
  if (vector_loads && first >= batch.begin && first + 4 <= end) {
    float4 p = *reinterpret_cast<const float4*>(params + first);
    float4 m = *reinterpret_cast<const float4*>(exp_avg + first);
    float4 v = *reinterpret_cast<const float4*>(exp_avg_sq + first);
    const float4 g = *reinterpret_cast<const float4*>(grads + first);
    const std::int64_t offset = first - batch.begin;
    adamw_element(p.x, m.x, v.x, g.x, decays(batch, offset + 0) ? h.weight_decay : 0.0f, h);  // SPEC 7
    adamw_element(p.y, m.y, v.y, g.y, decays(batch, offset + 1) ? h.weight_decay : 0.0f, h);
    adamw_element(p.z, m.z, v.z, g.z, decays(batch, offset + 2) ? h.weight_decay : 0.0f, h);
    adamw_element(p.w, m.w, v.w, g.w, decays(batch, offset + 3) ? h.weight_decay : 0.0f, h);
    *reinterpret_cast<float4*>(params + first) = p;
    *reinterpret_cast<float4*>(exp_avg + first) = m;
    *reinterpret_cast<float4*>(exp_avg_sq + first) = v;
    if (compute_weights != nullptr) {
      store(compute_weights, first + 0, p.x);
      store(compute_weights, first + 1, p.y);
      store(compute_weights, first + 2, p.z);
      store(compute_weights, first + 3, p.w);
    }
    return;
  }
  for (std::int64_t i = first; i < first + 4 && i < end; ++i) {
    if (i < batch.begin) continue;
    float param = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(param, m, v, grads[i], decays(batch, i - batch.begin) ? h.weight_decay : 0.0f, h);  // SPEC 7
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    params[i] = param;
    if (compute_weights != nullptr) store(compute_weights, i, param);
  }
}

// Thread k scales elements [4k, 4k + 4): one float4 when all four exist and the base is aligned.
__global__ void scale_kernel(float* values, std::int64_t count, float factor, bool vector_loads) {
  const std::int64_t first = 4 * (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (first >= count) return;
  if (vector_loads && first + 4 <= count) {
    float4 four = *reinterpret_cast<const float4*>(values + first);
    four = make_float4(mul(four.x, factor), mul(four.y, factor), mul(four.z, factor), mul(four.w, factor));
    *reinterpret_cast<float4*>(values + first) = four;
    return;
  }
  for (std::int64_t i = first; i < first + 4 && i < count; ++i) values[i] = mul(values[i], factor);
}

template <class Compute>
void launch_adamw(const AdamwParams& p, Compute* compute_weights, const SegmentBatch& batch,
                  const CudaLaunch& launch) {
  const bool vector_loads = aligned_16(p.params) && aligned_16(p.exp_avg) && aligned_16(p.exp_avg_sq) &&
                            aligned_16(p.grads);  // compute weights: element stores
  const std::int64_t vectors = (batch.begin + batch.count - (batch.begin / 4) * 4 + 3) / 4;
  TANDEM_LAUNCH(blocks_for(vectors, kThreads), kThreads, 0, stream_of(launch), adamw_kernel<Compute>)(
      p.params, p.exp_avg, p.exp_avg_sq, p.grads, compute_weights, batch, p.hyper, vector_loads);
  TANDEM_CUDA_CHECK_LAUNCH(adamw_kernel);
}

}  // namespace

void squared_norm_cuda(const SquaredNormParams& p, const CudaLaunch& launch) {
  if (p.block_elements <= 0) {
    throw std::invalid_argument("squared_norm: block_elements must be > 0, got " +
                                std::to_string(p.block_elements));
  }
  if (p.count <= 0) return;
  const bool vector_loads = aligned_16(p.values) && p.block_elements % 4 == 0;  // every block's start aligned
  TANDEM_LAUNCH(blocks_for(p.count, p.block_elements), kNormThreads, 0, stream_of(launch), squared_norm_kernel)(
      p.values, p.block_sums, p.count, p.block_elements, vector_loads);
  TANDEM_CUDA_CHECK_LAUNCH(squared_norm_kernel);
}

void adamw_cuda(const AdamwParams& p, const CudaLaunch& launch) {
  // The host twin's checks, with its messages: the segments tile [0, count) in order.
  std::int64_t covered = 0;
  for (std::int64_t segment = 0; segment < p.segment_count; ++segment) {
    if (p.segments[segment].begin != covered) {
      throw std::invalid_argument("adamw: decay segments must tile the range in order");
    }
    covered += p.segments[segment].count;
  }
  if (covered != p.count) {
    throw std::invalid_argument("adamw: decay segments cover " + std::to_string(covered) + " of " +
                                std::to_string(p.count) + " elements");
  }
  for (std::int64_t first = 0; first < p.segment_count; first += kMaxSegments) {
    SegmentBatch batch;
    batch.begin = p.segments[first].begin;
    batch.segments = static_cast<int>(std::min<std::int64_t>(kMaxSegments, p.segment_count - first));
    for (int s = 0; s < batch.segments; ++s) {
      const DecaySegment& run = p.segments[first + s];
      batch.ends[s] = run.begin + run.count - batch.begin;
      batch.decay[s] = run.decay;
    }
    batch.count = batch.ends[batch.segments - 1];
    if (batch.count <= 0) continue;
    if (p.compute_weights == nullptr) {
      launch_adamw<Bf16>(p, nullptr, batch, launch);
    } else if (p.compute_dtype == DType::bf16) {
      launch_adamw(p, static_cast<Bf16*>(p.compute_weights), batch, launch);
    } else {
      launch_adamw(p, static_cast<float*>(p.compute_weights), batch, launch);
    }
  }
}

void scale_cuda(const ScaleParams& p, const CudaLaunch& launch) {
  if (p.count <= 0) return;
  TANDEM_LAUNCH(blocks_for((p.count + 3) / 4, kThreads), kThreads, 0, stream_of(launch), scale_kernel)(
      p.values, p.count, p.factor, aligned_16(p.values));
  TANDEM_CUDA_CHECK_LAUNCH(scale_kernel);
}

}  // namespace tandem::production
