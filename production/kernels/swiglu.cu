// CUDA twin of SwiGLU's product (swiglu.hpp): one thread per element. Multiplications, the add and
// the division round where the host's do (unfused); expf is CUDA's (at most 2 ulp, where the
// host's std::exp is glibc's), so the twins agree to a few ulp rather than bit for bit.
#include "production/cuda/kernel_support.cuh"
#include "production/kernels/swiglu.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) { return div(1.0f, add(1.0f, expf(-g))); }

template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* hidden, std::int64_t count) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float g = load(gate, i);
  store(hidden, i, mul(mul(g, sigmoid(g)), load(up, i)));
}

template <class T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* hidden_grad, T* gate_grad,
                                       T* up_grad, std::int64_t count) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float g = load(gate, i);
  const float u = load(up, i);
  const float dh = load(hidden_grad, i);
  const float sigma = sigmoid(g);
  const float silu = mul(g, sigma);
  // silu'(g) = sigma (1 + g (1 - sigma)), as the host writes it.
  const float silu_derivative = mul(sigma, add(1.0f, mul(g, sub(1.0f, sigma))));
  store(gate_grad, i, mul(mul(dh, u), silu_derivative));
  store(up_grad, i, mul(dh, silu));
}

}  // namespace

void swiglu_forward_cuda(const SwigluForwardParams& p, const CudaLaunch& launch) {
  if (p.count <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.count, kThreads), kThreads, 0, stream_of(launch), swiglu_forward_kernel<T>)(
        static_cast<const T*>(p.gate), static_cast<const T*>(p.up), static_cast<T*>(p.hidden), p.count);
  });
  TANDEM_CUDA_CHECK_LAUNCH(swiglu_forward_kernel);
}

void swiglu_backward_cuda(const SwigluBackwardParams& p, const CudaLaunch& launch) {
  if (p.count <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.count, kThreads), kThreads, 0, stream_of(launch), swiglu_backward_kernel<T>)(
        static_cast<const T*>(p.gate), static_cast<const T*>(p.up), static_cast<const T*>(p.hidden_grad),
        static_cast<T*>(p.gate_grad), static_cast<T*>(p.up_grad), p.count);
  });
  TANDEM_CUDA_CHECK_LAUNCH(swiglu_backward_kernel);
}

}  // namespace tandem::production
