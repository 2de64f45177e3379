// CUDA twins of the elementwise ops (elementwise.hpp). Each rounds exactly where the host twin
// does (unfused fp32, the same bf16 rounding), so the two agree bit for bit; bias_grad sums each
// column over rows in increasing order, the host's order, one thread per column.
#include "production/cuda/kernel_support.cuh"
#include "production/kernels/elementwise.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;

template <class In, class Out>
__global__ void convert_kernel(const In* input, Out* output, std::int64_t count) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) store(output, i, load(input, i));
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* output, std::int64_t count) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) store(output, i, add(load(a, i), load(b, i)));
}

template <class T>
__global__ void bias_add_kernel(T* values, const T* bias, std::int64_t rows, std::int64_t width) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * width) store(values, i, add(load(values, i), load(bias, i % width)));
}

template <class T>
__global__ void bias_grad_kernel(const T* output_grad, float* bias_grad, std::int64_t rows,
                                 std::int64_t width) {
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= width) return;
  float sum = bias_grad[column];
  for (std::int64_t row = 0; row < rows; ++row) sum = add(sum, load(output_grad, row * width + column));
  bias_grad[column] = sum;
}

}  // namespace

void convert_cuda(const ConvertParams& p, const CudaLaunch& launch) {
  if (p.count <= 0) return;
  with_storage_type(p.input_dtype, [&](auto in_tag) {
    using In = decltype(in_tag);
    with_storage_type(p.output_dtype, [&](auto out_tag) {
      using Out = decltype(out_tag);
      TANDEM_LAUNCH(blocks_for(p.count, kThreads), kThreads, 0, stream_of(launch), convert_kernel<In, Out>)(
          static_cast<const In*>(p.input), static_cast<Out*>(p.output), p.count);
    });
  });
  TANDEM_CUDA_CHECK_LAUNCH(convert_kernel);
}

void add_cuda(const AddParams& p, const CudaLaunch& launch) {
  if (p.count <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.count, kThreads), kThreads, 0, stream_of(launch), add_kernel<T>)(
        static_cast<const T*>(p.a), static_cast<const T*>(p.b), static_cast<T*>(p.output), p.count);
  });
  TANDEM_CUDA_CHECK_LAUNCH(add_kernel);
}

void bias_add_cuda(const BiasAddParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0 || p.width <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows * p.width, kThreads), kThreads, 0, stream_of(launch), bias_add_kernel<T>)(
        static_cast<T*>(p.values), static_cast<const T*>(p.bias), p.rows, p.width);
  });
  TANDEM_CUDA_CHECK_LAUNCH(bias_add_kernel);
}

void bias_grad_cuda(const BiasGradParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0 || p.width <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.width, kThreads), kThreads, 0, stream_of(launch), bias_grad_kernel<T>)(
        static_cast<const T*>(p.output_grad), p.bias_grad, p.rows, p.width);
  });
  TANDEM_CUDA_CHECK_LAUNCH(bias_grad_kernel);
}

}  // namespace tandem::production
