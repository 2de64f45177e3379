// The production twin against the cuda-sim build of the production sources (the cuda backend and
// the shipped CUDA sources on the CPU, docs/CUDA-SIM.md): production_twin.cpp compiled a third
// time, with cuda-sim's stand-in headers first (equivalence/CMakeLists.txt). It exports
// cuda_sim_production_twin_maker (production_twin.hpp).
#include "equivalence/production_twin.cpp"  // NOLINT(bugprone-suspicious-include): the same source, the cuda-sim build
