// NCCL ranks for the cuda backend: the data plane (gradients, weights) moves device memory with
// NCCL on the backend's stream; the control plane (counts, partial sums) goes through MPI, which
// also hands NCCL its unique id. Requires an active MpiSession (mpi.hpp) and one device per rank.
#pragma once

#include <memory>

#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// The collectives of the ranks of `control` over NCCL, on `backend`'s CUDA stream: `control` is
// the same ranks' host-memory collectives (MPI_COMM_WORLD when null, or a grid group's
// sub-communicator, mpi.hpp), which carries the control plane and hands NCCL its unique id. A
// communicator per group, as Megatron makes one per process group. Collective over `control`'s
// ranks. Throws std::runtime_error naming the NCCL call and its error, and
// std::invalid_argument for a backend that is not cuda.
std::shared_ptr<Collectives> make_nccl_collectives(Backend& backend, std::shared_ptr<Collectives> control = nullptr);

}  // namespace tandem::production
