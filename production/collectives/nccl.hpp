// NCCL ranks for the cuda backend: the data plane (gradients, weights) moves device memory with
// NCCL on the backend's stream; the control plane (counts, partial sums) goes through MPI, which
// also hands NCCL its unique id. Requires an active MpiSession (mpi.hpp) and one device per rank.
#pragma once

#include <memory>

#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production {

// The collectives of MPI_COMM_WORLD over NCCL, on `backend`'s CUDA stream. Throws
// std::runtime_error naming the NCCL call and its error, and std::invalid_argument for a backend
// that is not cuda.
std::shared_ptr<Collectives> make_nccl_collectives(Backend& backend);

}  // namespace tandem::production
