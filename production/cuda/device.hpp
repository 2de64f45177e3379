// Which CUDA devices answer. Any cudaGetDeviceCount error (35 without a driver) means none:
// callers then use the cpu backend and CUDA tests skip.
#pragma once

#include <cstdint>
#include <string>

#include "production/cuda/target.hpp"

namespace tandem::cuda::inline TANDEM_CUDA_TARGET {

// Number of CUDA devices that answer; 0 when the runtime reports any error.
int device_count();

// Makes device `index` the calling thread's (cudaSetDevice): a thread that runs a rank's calls on
// a device of its own sets it first, as a fresh thread's device is 0. Throws std::runtime_error
// naming the CUDA error.
void use_device(int index);

// "NVIDIA H200 (sm_90, 139 GiB)" for device `index`, or the runtime's error text.
std::string device_description(int index);

// Device memory as the driver reports it (cudaMemGetInfo on device `index`): what every process
// and context holds, the cuda backend's cudaMalloc'd buffers and the CUDA context included.
struct DeviceMemory {
  std::int64_t free_bytes = 0;
  std::int64_t total_bytes = 0;
  std::int64_t used_bytes() const { return total_bytes - free_bytes; }
};
// Throws std::runtime_error naming the CUDA error when the device does not answer.
DeviceMemory device_memory(int index);

}  // namespace tandem::cuda::inline TANDEM_CUDA_TARGET
