// CUDA twin of RMSNorm (rmsnorm.hpp).
//   forward: one block per row; the sum of squares in a fixed tree (block_sum), then every
//     element with the host's roundings (unfused). With the same sum the outputs are the host's
//     bit for bit; the sum's order differs from the host's sequential one.
//   backward: one block per row for dx (the dot product in a fixed tree); dw in two fixed-order
//     passes, no atomics: partial sums over blocks of kRowsPerPartial rows (rows increasing), then
//     per column weight_grad + the partials in block order.
#include "production/cuda/kernel_support.cuh"
#include "production/kernels/rmsnorm.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;
constexpr std::int64_t kRowsPerPartial = 32;

template <class T>
__global__ void rmsnorm_forward_kernel(const T* input, const T* weight, T* output, float* inverse_rms,
                                       std::int64_t width, float epsilon) {
  __shared__ float scratch[kThreads];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * width;
  float partial = 0.0f;
  for (std::int64_t j = threadIdx.x; j < width; j += kThreads) {
    const float x = load(input, base + j);
    partial = add(partial, mul(x, x));
  }
  const float sum_of_squares = block_sum(partial, scratch);
  const float mean_square = div(sum_of_squares, static_cast<float>(width));
  const float scale = div(1.0f, sqrt_rn(add(mean_square, epsilon)));
  if (threadIdx.x == 0) inverse_rms[blockIdx.x] = scale;
  for (std::int64_t j = threadIdx.x; j < width; j += kThreads) {
    store(output, base + j, mul(mul(load(input, base + j), scale), load(weight, j)));
  }
}

template <class T>
__global__ void rmsnorm_input_grad_kernel(const T* input, const T* weight, const float* inverse_rms,
                                          const T* output_grad, T* input_grad, std::int64_t width,
                                          bool accumulate) {
  __shared__ float scratch[kThreads];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * width;
  const float r = inverse_rms[blockIdx.x];
  float partial = 0.0f;  // sum_j dy_j w_j x_j
  for (std::int64_t j = threadIdx.x; j < width; j += kThreads) {
    partial = add(partial, mul(mul(load(output_grad, base + j), load(weight, j)), load(input, base + j)));
  }
  const float weighted_dot = block_sum(partial, scratch);
  const float correction = div(mul(mul(mul(r, r), r), weighted_dot), static_cast<float>(width));
  for (std::int64_t k = threadIdx.x; k < width; k += kThreads) {
    const float x = load(input, base + k);
    const float dy = load(output_grad, base + k);
    float dx = sub(mul(mul(r, load(weight, k)), dy), mul(correction, x));
    if (accumulate) dx = add(dx, load(input_grad, base + k));
    store(input_grad, base + k, dx);
  }
}

// partials[block, j] = sum over the block's rows (increasing) of dy_j x_j r.
template <class T>
__global__ void rmsnorm_weight_partial_kernel(const T* input, const float* inverse_rms, const T* output_grad,
                                              float* partials, std::int64_t rows, std::int64_t width) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= width) return;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRowsPerPartial;
  const std::int64_t end = first + kRowsPerPartial < rows ? first + kRowsPerPartial : rows;
  float sum = 0.0f;
  for (std::int64_t row = first; row < end; ++row) {
    const std::int64_t i = row * width + j;
    sum = add(sum, mul(mul(load(output_grad, i), load(input, i)), inverse_rms[row]));
  }
  partials[static_cast<std::int64_t>(blockIdx.y) * width + j] = sum;
}

__global__ void rmsnorm_weight_total_kernel(const float* partials, float* weight_grad, std::int64_t blocks,
                                            std::int64_t width) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= width) return;
  float sum = weight_grad[j];
  for (std::int64_t block = 0; block < blocks; ++block) sum = add(sum, partials[block * width + j]);
  weight_grad[j] = sum;
}

}  // namespace

void rmsnorm_forward_cuda(const RmsnormForwardParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0 || p.width <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows, 1), kThreads, 0, stream_of(launch), rmsnorm_forward_kernel<T>)(
        static_cast<const T*>(p.input), static_cast<const T*>(p.weight), static_cast<T*>(p.output),
        p.inverse_rms, p.width, p.epsilon);
  });
  TANDEM_CUDA_CHECK_LAUNCH(rmsnorm_forward_kernel);
}

void rmsnorm_backward_cuda(const RmsnormBackwardParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0 || p.width <= 0) return;
  const std::int64_t blocks = (p.rows + kRowsPerPartial - 1) / kRowsPerPartial;
  if (blocks > 65535) throw std::invalid_argument("rmsnorm_backward_cuda: rows over 65535 * 32");
  auto* partials = static_cast<float*>(workspace_of(
      launch, blocks * p.width * static_cast<std::int64_t>(sizeof(float)), "rmsnorm_backward_cuda"));
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows, 1), kThreads, 0, stream_of(launch), rmsnorm_input_grad_kernel<T>)(
        static_cast<const T*>(p.input), static_cast<const T*>(p.weight), p.inverse_rms,
        static_cast<const T*>(p.output_grad), static_cast<T*>(p.input_grad), p.width, p.accumulate_input_grad);
    TANDEM_CUDA_CHECK_LAUNCH(rmsnorm_input_grad_kernel);
    const dim3 grid(blocks_for(p.width, kThreads), static_cast<unsigned int>(blocks));
    TANDEM_LAUNCH(grid, kThreads, 0, stream_of(launch), rmsnorm_weight_partial_kernel<T>)(
        static_cast<const T*>(p.input), p.inverse_rms, static_cast<const T*>(p.output_grad), partials, p.rows,
        p.width);
    TANDEM_CUDA_CHECK_LAUNCH(rmsnorm_weight_partial_kernel);
  });
  TANDEM_LAUNCH(blocks_for(p.width, kThreads), kThreads, 0, stream_of(launch), rmsnorm_weight_total_kernel)(
      partials, p.weight_grad, blocks, p.width);
  TANDEM_CUDA_CHECK_LAUNCH(rmsnorm_weight_total_kernel);
}

}  // namespace tandem::production
