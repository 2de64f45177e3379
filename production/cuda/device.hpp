// Which CUDA devices answer. Any cudaGetDeviceCount error (35 without a driver) means none:
// callers then use the cpu backend and CUDA tests skip.
#pragma once

#include <string>

namespace tandem::cuda {

// Number of CUDA devices that answer; 0 when the runtime reports any error.
int device_count();

// "NVIDIA H200 (sm_90, 139 GiB)" for device `index`, or the runtime's error text.
std::string device_description(int index);

}  // namespace tandem::cuda
