// cuda-sim's hazard checks (cuda_sim/hazards.cpp, docs/CUDA-SIM.md "Hazard checks"): linked only
// into a checked executable, whose kernel units are compiled with -fsanitize=thread.
#pragma once

namespace tandem::cuda_sim {

// Whether the running OS thread's static __shared__ variables (the executable's thread-locals)
// are checked: false where the executable's TLS block is not where x86-64 puts it.
bool static_shared_checked();

}  // namespace tandem::cuda_sim
