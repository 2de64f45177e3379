// cuda-sim's stand-in for <cuda_runtime.h>: what the project's .cu files use of the CUDA language
// and runtime, for the host compiler (docs/CUDA-SIM.md). Only targets built for cuda-sim put this
// directory on their include path, ahead of the CUDA Toolkit's; nothing else may include it.
//
// Declared here and nothing more (a kernel that needs something else fails to compile, never runs
// on a guess):
//   - qualifiers: __global__, __device__, __host__, __forceinline__, __launch_bounds__, __shared__
//     (a block's own: static thread_local, a launch's blocks running one after another on an OS
//     thread of the launch's own, so it starts zeroed at the launch's first block and holds what
//     the block before left at the others; CUDA leaves it undefined), __align__;
//   - built-ins threadIdx, blockIdx, blockDim, gridDim, warpSize; uint3, dim3, float4, uint4;
//   - dynamic shared memory through TANDEM_DYNAMIC_SHARED (kernel_support.cuh writes it as
//     extern __shared__ for nvcc) and its limit, cudaFuncSetAttribute with
//     cudaFuncAttributeMaxDynamicSharedMemorySize;
//   - the tensor-core instructions mma.sync m16n8k16 bf16 and ldmatrix x4 [.trans], as warp
//     collectives (tensor_core.hpp), called where the .cu file writes the PTX for nvcc;
//   - __syncthreads, __shfl_xor_sync, __shfl_down_sync (engine.hpp's rules), the exact IEEE fp32
//     __f*_rn intrinsics, __float_as_uint / __uint_as_float; fmaxf, expf, logf from the C library;
//     the integer min and max overloads;
//   - launches through TANDEM_LAUNCH (production/cuda/kernel_support.cuh writes it as <<<>>> for
//     nvcc), the error calls cudaGetLastError, cudaPeekAtLastError, cudaGetErrorName/String,
//     cudaDeviceSynchronize and cudaDeviceReset;
//   - what the cuda backend calls of devices, memory, streams and events (below).
#pragma once

#include <math.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <type_traits>
#include <utility>

#include "cuda_sim/engine.hpp"
#include "cuda_sim/streams.hpp"
#include "cuda_sim/tensor_core.hpp"

#define TANDEM_CUDA_SIM 1

// Qualifiers. A __global__ function is an ordinary function the launcher calls once per thread.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(bytes) __attribute__((aligned(bytes)))

struct uint3 {
  unsigned int x = 0, y = 0, z = 0;
};

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) float4 {
  float x = 0, y = 0, z = 0, w = 0;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct alignas(16) uint4 {
  unsigned int x = 0, y = 0, z = 0, w = 0;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

// The launch's dynamic shared memory, the block's own (engine.hpp's dynamic_shared).
#define TANDEM_DYNAMIC_SHARED(type, name) type* const name = static_cast<type*>(::tandem::cuda_sim::dynamic_shared())

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

// Exact IEEE binary32 operations, rounded to nearest even: the host's own (cuda-sim's targets
// compile with -ffp-contract=off, so nothing fuses them).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline unsigned int __float_as_uint(float value) { return std::bit_cast<unsigned int>(value); }
inline float __uint_as_float(unsigned int bits) { return std::bit_cast<float>(bits); }

// CUDA's integer min / max overloads (device functions at global scope).
#define TANDEM_CUDA_SIM_MIN_MAX(type)                                  \
  inline type min(type a, type b) { return b < a ? b : a; }          \
  inline type max(type a, type b) { return a < b ? b : a; }
TANDEM_CUDA_SIM_MIN_MAX(int)
TANDEM_CUDA_SIM_MIN_MAX(unsigned int)
TANDEM_CUDA_SIM_MIN_MAX(long)
TANDEM_CUDA_SIM_MIN_MAX(unsigned long)
TANDEM_CUDA_SIM_MIN_MAX(long long)
TANDEM_CUDA_SIM_MIN_MAX(unsigned long long)
#undef TANDEM_CUDA_SIM_MIN_MAX

#define __syncthreads() ::tandem::cuda_sim::sync_threads(__FILE__, __LINE__)

namespace tandem::cuda_sim {

template <class T>
T shuffle_value(ShuffleKind kind, const char* file, int line, unsigned int mask, T value, int lane_argument,
                int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "cuda-sim shuffles values of up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle(kind, mask, bits, lane_argument, width, file, line);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

}  // namespace tandem::cuda_sim

#define __shfl_xor_sync(...) \
  ::tandem::cuda_sim::shuffle_value(::tandem::cuda_sim::ShuffleKind::xor_lane, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) \
  ::tandem::cuda_sim::shuffle_value(::tandem::cuda_sim::ShuffleKind::down, __FILE__, __LINE__, __VA_ARGS__)

// The runtime's errors.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
struct CUstream_st;
using cudaStream_t = CUstream_st*;

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();

// Devices, memory, streams and events: devices "cuda-sim (sm_90 rules on the CPU)", as many as
// TANDEM_CUDA_SIM_DEVICES (8 by default), all sharing memory from the host's heap (a device is a
// name a thread sets, for NCCL's rule of one rank a device), and streams whose work runs in order, asynchronously to the host, ordered between streams
// by events only (streams.hpp's modes); the null stream runs its work on the calling thread, after
// every blocking stream's (docs/CUDA-SIM.md "Streams").
struct cudaDeviceProp {
  char name[256] = {};
  std::size_t totalGlobalMem = 0;
  std::size_t sharedMemPerBlockOptin = 0;
  int major = 0;
  int minor = 0;
  int multiProcessorCount = 0;
};
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
inline constexpr unsigned int cudaStreamDefault = 0x0;
inline constexpr unsigned int cudaStreamNonBlocking = 0x1;
inline constexpr unsigned int cudaEventDefault = 0x0;
inline constexpr unsigned int cudaEventDisableTiming = 0x2;

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device);
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);
// 256-byte aligned, filled with 0xFF bytes (a device leaves it undefined; all-ones reads as NaN).
cudaError_t cudaMalloc(void** pointer, std::size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** pointer, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMemsetAsync(void* destination, int value, std::size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
// The one attribute the kernels set; a limit over sm_90's 227 KiB is cudaErrorInvalidValue.
cudaError_t cuda_sim_func_set_attribute(const void* function, cudaFuncAttribute attribute, int value);
template <class Function>
cudaError_t cudaFuncSetAttribute(Function* function, cudaFuncAttribute attribute, int value) {
  return cuda_sim_func_set_attribute(reinterpret_cast<const void*>(function), attribute, value);
}

namespace tandem::cuda_sim {

// Launches on site.stream and records what went wrong as the runtime would: at the call, an
// invalid configuration as cudaErrorInvalidConfiguration or too much dynamic shared memory as
// cudaErrorInvalidValue (cleared by cudaGetLastError); when the launch runs, a fault inside the
// kernel as cudaErrorLaunchFailure, sticky until cudaDeviceReset. cudaGetErrorString gives the
// fault's text.
void run_launch(const LaunchSite& site, std::function<void()> thread_body);

// Queues `work` on `stream` (a library call such as cublasLtMatmul, a copy, a memset): it runs in
// the stream's order, after the call returns; on the null stream, on the calling thread before
// it returns. `work` must hold by value whatever it uses of the caller's. Nothing runs once a
// kernel has faulted: that sticky error is returned; an exception from `work` becomes the sticky
// cudaErrorLaunchFailure with its text, as a fault in a kernel does.
cudaError_t run_on_stream(cudaStream_t stream, std::function<void()> work);

inline Dim3 to_dim3(dim3 value) { return Dim3{value.x, value.y, value.z}; }
template <class Integer>
  requires std::is_integral_v<Integer>
Dim3 to_dim3(Integer value) {
  return Dim3{static_cast<unsigned int>(value), 1, 1};
}

// kernel<<<grid, block, shared, stream>>>(arguments...): the arguments are converted to the
// kernel's parameter types and copied, as CUDA passes them, then every thread runs the kernel.
template <class... Params>
class KernelLaunch {
 public:
  KernelLaunch(void (*kernel)(Params...), LaunchSite site) : kernel_(kernel), site_(site) {
    site_.function = reinterpret_cast<const void*>(kernel);
  }
  template <class... Args>
  void operator()(Args&&... arguments) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "a kernel launch passes every parameter");
    auto* kernel = kernel_;
    run_launch(site_, [kernel, ... copies = std::decay_t<Params>(std::forward<Args>(arguments))] { kernel(copies...); });
  }

 private:
  void (*kernel_)(Params...);
  LaunchSite site_;
};

template <class Grid, class Block, class... Params>
KernelLaunch<Params...> kernel_launch(void (*kernel)(Params...), const char* name, Grid grid, Block block,
                                      std::size_t dynamic_shared_bytes, cudaStream_t stream, const char* file,
                                      int line) {
  return KernelLaunch<Params...>(
      kernel, LaunchSite{name, file, line, to_dim3(grid), to_dim3(block), dynamic_shared_bytes, stream});
}

}  // namespace tandem::cuda_sim

// TANDEM_LAUNCH(grid, block, shared_bytes, stream, kernel)(arguments...).
#define TANDEM_LAUNCH(grid, block, shared_bytes, stream, ...)                                              \
  ::tandem::cuda_sim::kernel_launch(__VA_ARGS__, #__VA_ARGS__, grid, block, static_cast<std::size_t>(shared_bytes), \
                                    stream, __FILE__, __LINE__)
