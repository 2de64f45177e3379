// Error checking for every CUDA runtime and cuBLASLt call of the cuda backend: a failure throws
// std::runtime_error naming the call as written, the error's name and text, and where it was made.
// Included by .cu and .cpp files alike (no Boost, no nlohmann/json).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "production/cuda/target.hpp"

namespace tandem::cuda::inline TANDEM_CUDA_TARGET {

[[noreturn]] inline void throw_cuda_error(const char* call, cudaError_t status, const char* file,
                                          int line) {
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(const char* call, cublasStatus_t status,
                                            const char* file, int line) {
  throw std::runtime_error(std::string(call) + " failed: cuBLAS status " +
                           std::to_string(static_cast<int>(status)) + " (" +
                           cublasLtGetStatusString(status) + ") at " + file + ":" +
                           std::to_string(line));
}

}  // namespace tandem::cuda::inline TANDEM_CUDA_TARGET

// TANDEM_CUDA_CHECK(cudaMalloc(&p, bytes)) throws "cudaMalloc(&p, bytes) failed: ...".
#define TANDEM_CUDA_CHECK(call)                                                  \
  do {                                                                           \
    const cudaError_t tandem_cuda_status_ = (call);                              \
    if (tandem_cuda_status_ != cudaSuccess) {                                    \
      ::tandem::cuda::throw_cuda_error(#call, tandem_cuda_status_, __FILE__, __LINE__); \
    }                                                                            \
  } while (false)

// After a kernel launch: the launch's own error (bad configuration, missing image for this GPU).
#define TANDEM_CUDA_CHECK_LAUNCH(kernel_name)                                    \
  do {                                                                           \
    const cudaError_t tandem_cuda_status_ = cudaGetLastError();                  \
    if (tandem_cuda_status_ != cudaSuccess) {                                    \
      ::tandem::cuda::throw_cuda_error("launch of " #kernel_name, tandem_cuda_status_, __FILE__, \
                                       __LINE__);                                \
    }                                                                            \
  } while (false)

#define TANDEM_CUBLAS_CHECK(call)                                                \
  do {                                                                           \
    const cublasStatus_t tandem_cublas_status_ = (call);                         \
    if (tandem_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                        \
      ::tandem::cuda::throw_cublas_error(#call, tandem_cublas_status_, __FILE__, __LINE__); \
    }                                                                            \
  } while (false)
