// Running a subcommand on every rank of a launched job (mpirun, srun): how failures end it.
#pragma once

#include <functional>

#include "production/collectives/mpi.hpp"

namespace tandem::cli {

// Runs `body` and returns its exit code. With one rank, exceptions pass through to main (which
// prints them). With several: a ConfigError (every rank validates the same arguments, so every
// rank raises it) is printed by rank 0 and exits 2 on every rank; any other failure is printed
// with its rank and ends every rank through MPI_Abort (exit 1), since a rank that stops alone
// would leave the others waiting in a collective forever.
int run_as_ranks(const production::MpiSession& session, const std::function<int()>& body);

}  // namespace tandem::cli
