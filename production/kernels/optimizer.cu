// CUDA twins of the update path (optimizer.hpp).
//   squared_norm: one block per block of `block_elements`; each thread sums squares in double over
//     a fixed stride, then the block adds the threads' sums in a fixed tree (block_sum). No atomics;
//     the same answer every run. Differs from the host's sequential order only in rounding of
//     double sums (the squares themselves are exact in double).
//   adamw: one thread per element, SPEC 7's expression with the host's exact operation order and
//     roundings (unfused fp32, correctly rounded sqrt and division), so the twins agree bit for bit;
//     the decay segments (host memory) travel by value in the launch, kMaxSegments per launch.
//   scale: one thread per element, exact.
#include <algorithm>

#include "production/cuda/kernel_support.cuh"
#include "production/kernels/optimizer.hpp"

namespace tandem::production {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;
constexpr int kNormThreads = 512;
constexpr int kMaxSegments = 64;

__global__ void squared_norm_kernel(const float* values, double* block_sums, std::int64_t count,
                                    std::int64_t block_elements) {
  __shared__ double scratch[kNormThreads];
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * block_elements;
  const std::int64_t end = begin + block_elements < count ? begin + block_elements : count;
  double sum = 0.0;
#pragma unroll 4
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kNormThreads) {
    const double value = values[i];
    sum += value * value;  // exact square of an fp32 value
  }
  const double total = block_sum(sum, scratch);
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

template <class Compute>
__global__ void adamw_kernel(float* params, float* exp_avg, float* exp_avg_sq, const float* grads,
                             Compute* compute_weights, SegmentBatch batch, AdamwHyper h) {
  const std::int64_t offset = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (offset >= batch.count) return;
  // The first segment whose end lies past `offset` (binary search: at most 6 steps for 64).
  int low = 0, high = batch.segments - 1;
  while (low < high) {
    const int middle = (low + high) / 2;
    if (offset < batch.ends[middle]) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  const int segment = low;
  const float weight_decay = batch.decay[segment] ? h.weight_decay : 0.0f;  // SPEC 7
  const std::int64_t i = batch.begin + offset;
  const float g = grads[i];
  const float m = add(mul(h.beta1, exp_avg[i]), mul(h.one_minus_beta1, g));
  const float v = add(mul(h.beta2, exp_avg_sq[i]), mul(mul(h.one_minus_beta2, g), g));
  const float m_hat = div(m, h.bias_correction1);
  const float v_hat = div(v, h.bias_correction2);
  const float param_old = params[i];
  const float step = add(div(m_hat, add(sqrt_rn(v_hat), h.eps)), mul(weight_decay, param_old));
  const float param = sub(param_old, mul(h.lr, step));
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  params[i] = param;
  if (compute_weights != nullptr) store(compute_weights, i, param);
}

__global__ void scale_kernel(float* values, std::int64_t count, float factor) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) values[i] = mul(values[i], factor);
}

template <class Compute>
void launch_adamw(const AdamwParams& p, Compute* compute_weights, const SegmentBatch& batch,
                  const CudaLaunch& launch) {
  adamw_kernel<Compute><<<blocks_for(batch.count, kThreads), kThreads, 0, stream_of(launch)>>>(
      p.params, p.exp_avg, p.exp_avg_sq, p.grads, compute_weights, batch, p.hyper);
  TANDEM_CUDA_CHECK_LAUNCH(adamw_kernel);
}

}  // namespace

void squared_norm_cuda(const SquaredNormParams& p, const CudaLaunch& launch) {
  if (p.block_elements <= 0) {
    throw std::invalid_argument("squared_norm: block_elements must be > 0, got " +
                                std::to_string(p.block_elements));
  }
  if (p.count <= 0) return;
  squared_norm_kernel<<<blocks_for(p.count, p.block_elements), kNormThreads, 0, stream_of(launch)>>>(
      p.values, p.block_sums, p.count, p.block_elements);
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
  scale_kernel<<<blocks_for(p.count, kThreads), kThreads, 0, stream_of(launch)>>>(p.values, p.count, p.factor);
  TANDEM_CUDA_CHECK_LAUNCH(scale_kernel);
}

}  // namespace tandem::production
