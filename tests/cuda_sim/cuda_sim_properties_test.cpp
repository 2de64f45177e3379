// The equivalence harness's properties (equivalence/properties.hpp) on the cuda-sim twin
// (equivalence/twin.hpp production_cuda_sim_twin: the production trainer's cuda build with the
// shipped CUDA sources on the CPU, TP x PP x DP ranks on threads), each with its fixed default-suite
// seed (gtest_registration.hpp) and the few cases tests/cuda_sim/CMakeLists.txt gives it through
// RC_PARAMS: the draws of random small models, batches and layouts reach the CUDA sources too.
#include <gtest/gtest.h>

#include "equivalence/gtest_registration.hpp"

namespace {

const bool registered = [] {
  tandem::equivalence::register_equivalence_properties("CudaSimEquivalence", /*soak=*/false,
                                                       {tandem::equivalence::production_cuda_sim_twin()});
  return true;
}();

}  // namespace
