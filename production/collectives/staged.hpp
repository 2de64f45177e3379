// Device memory exchanged through host-memory collectives: the cuda backend's transport when its
// ranks cannot use NCCL because several of them share one GPU (NCCL refuses a device twice in
// one communicator; one GPU running TP 2 as two ranks, as ci/gpu-check does). Each data-plane
// exchange synchronizes the backend, copies the bytes to the host, runs the host collectives
// (MPI), and copies the result back; the control plane passes through. The same bytes move, so
// the results are the same bits as over NCCL (collectives.hpp: none of them reduces); only slower.
#pragma once

#include <memory>

#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// `host`'s ranks, exchanging `backend`'s memory through host buffers. Never called from a lane's
// worker thread (callable_from_other_threads() is false: the lane runs inline).
std::shared_ptr<Collectives> make_host_staged_collectives(Backend& backend, std::shared_ptr<Collectives> host);

}  // namespace tandem::production
