// Choosing a backend (backend.hpp): the cpu backend always, the cuda backend when this build holds
// production/cuda/cuda_backend.cpp (TANDEM_HAVE_CUDA_BACKEND, set by production/CMakeLists.txt).
#include "production/backend.hpp"

#include <stdexcept>
#include <string>

#include "production/cuda/device.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

std::string to_string(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

bool cuda_backend_built() {
#ifdef TANDEM_HAVE_CUDA_BACKEND
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(Device device, int device_index, HostKernels host_kernels, int cpu_threads) {
  if (device == Device::cpu) return make_host_backend(host_kernels, cpu_threads);
#ifdef TANDEM_HAVE_CUDA_BACKEND
  const int devices = tandem::cuda::device_count();
  if (devices == 0) {
    throw std::runtime_error("--device cuda: no CUDA device answers (" +
                             tandem::cuda::device_description(0) +
                             "); fix: run on a GPU machine or use --device cpu");
  }
  if (device_index < 0 || device_index >= devices) {
    throw std::runtime_error("--device cuda: this rank's device " + std::to_string(device_index) +
                             " (its local rank) does not exist; " + std::to_string(devices) +
                             " devices answer; fix: launch at most one rank per device on a node");
  }
  return make_cuda_backend(device_index);
#else
  (void)device_index;
  throw std::runtime_error(
      "--device cuda: this build of the production sources (the semantic twin, Real = double) has no cuda "
      "backend; fix: use --device cpu");
#endif
}

}  // namespace tandem::production
