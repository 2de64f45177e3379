// CUDA twin of RoPE (rope.hpp). The table is built in double like the host's (CUDA's pow/cos/sin
// are within 2 ulp of double, so after the rounding to fp32 an entry can differ from the host's
// by at most 1 fp32 ulp, and only when the double lands within 2^-28 relative of a rounding
// boundary). The rotation rounds where the host's does (unfused), so for the same table it is
// bit-identical. One thread per (row, head, pair).
#include "production/cuda/kernel_support.cuh"
#include "production/kernels/rope.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;

__global__ void rope_table_kernel(const std::int32_t* positions, float* cosines, float* sines,
                                  std::int64_t rows, std::int64_t head_dim, double base) {
  const std::int64_t half = head_dim / 2;
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * half) return;
  const std::int64_t row = index / half;
  const std::int64_t i = index % half;
  // SPEC 4: frequency base^(-2i/hd), in double.
  const double frequency = pow(base, static_cast<double>(-2 * i) / static_cast<double>(head_dim));
  const double angle = static_cast<double>(positions[row]) * frequency;
  cosines[index] = static_cast<float>(cos(angle));
  sines[index] = static_cast<float>(sin(angle));
}

// direction +1: forward rotation; -1: its transpose (the backward), as the host's `rotate`.
template <class T>
__global__ void rope_rotate_kernel(T* activations, const float* cosines, const float* sines,
                                   std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                                   float direction) {
  const std::int64_t half = head_dim / 2;
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * heads * half) return;
  const std::int64_t i = index % half;
  const std::int64_t head = (index / half) % heads;
  const std::int64_t row = index / (half * heads);
  const std::int64_t base = row * heads * head_dim + head * head_dim;
  const float c = cosines[row * half + i];
  const float sine = direction * sines[row * half + i];  // exact: a sign change
  const float first = load(activations, base + i);
  const float second = load(activations, base + i + half);
  store(activations, base + i, sub(mul(first, c), mul(second, sine)));
  store(activations, base + i + half, add(mul(second, c), mul(first, sine)));
}

template <class T>
void rotate(const RopeParams& p, const CudaLaunch& launch, float direction) {
  const std::int64_t pairs = p.rows * p.heads * (p.head_dim / 2);
  if (pairs <= 0) return;
  TANDEM_LAUNCH(blocks_for(pairs, kThreads), kThreads, 0, stream_of(launch), rope_rotate_kernel<T>)(
      static_cast<T*>(p.activations), p.cosines, p.sines, p.rows, p.heads, p.head_dim, direction);
  TANDEM_CUDA_CHECK_LAUNCH(rope_rotate_kernel);
}

}  // namespace

void rope_table_cuda(const RopeTableParams& p, const CudaLaunch& launch) {
  const std::int64_t entries = p.rows * (p.head_dim / 2);
  if (entries <= 0) return;
  TANDEM_LAUNCH(blocks_for(entries, kThreads), kThreads, 0, stream_of(launch), rope_table_kernel)(
      p.positions, p.cosines, p.sines, p.rows, p.head_dim, p.base);
  TANDEM_CUDA_CHECK_LAUNCH(rope_table_kernel);
}

void rope_forward_cuda(const RopeParams& p, const CudaLaunch& launch) {
  with_storage_type(p.dtype, [&](auto tag) { rotate<decltype(tag)>(p, launch, 1.0f); });
}

void rope_backward_cuda(const RopeParams& p, const CudaLaunch& launch) {
  with_storage_type(p.dtype, [&](auto tag) { rotate<decltype(tag)>(p, launch, -1.0f); });
}

}  // namespace tandem::production
