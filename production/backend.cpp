// Choosing a backend (backend.hpp): the cpu backend always, the cuda backend when this build holds
// production/cuda/cuda_backend.cpp (TANDEM_HAVE_CUDA_BACKEND, set by production/CMakeLists.txt).
#include "production/backend.hpp"

#include <stdexcept>

#include "production/cuda/device.hpp"

namespace tandem::production {

std::string to_string(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

bool cuda_backend_built() {
#ifdef TANDEM_HAVE_CUDA_BACKEND
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(Device device) {
  if (device == Device::cpu) return make_host_backend();
#ifdef TANDEM_HAVE_CUDA_BACKEND
  if (tandem::cuda::device_count() == 0) {
    throw std::runtime_error("--device cuda: no CUDA device answers (" +
                             tandem::cuda::device_description(0) +
                             "); fix: run on a GPU machine or use --device cpu");
  }
  return make_cuda_backend();
#else
  throw std::runtime_error(
      "--device cuda: the cuda backend is not built yet; fix: use --device cpu");
#endif
}

}  // namespace tandem::production
