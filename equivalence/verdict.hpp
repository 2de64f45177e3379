// Agreement across ranks, so the harness can drive a multi-rank production trainer under
// `mpirun -np 2/4` without rework: every rank draws the same cases (the same seed), and a
// verdict seen on one rank is seen by all before RC_ASSERT. Otherwise one rank would shrink while
// the others went on, and the collectives inside the trainer would deadlock.
#pragma once

#include <cstdint>

namespace tandem::equivalence {

// The logical AND of `holds` over every rank of MPI_COMM_WORLD; the identity with one process
// (or when MPI is not initialized, as in the single-process test executables).
bool agree_on_verdict(bool holds);

// MPI_COMM_WORLD's size when MPI is initialized (and not finalized), else 1.
int mpi_world_size();

// Rank 0's seed on every rank; the identity with one process.
std::uint64_t agree_on_seed(std::uint64_t seed);

}  // namespace tandem::equivalence
