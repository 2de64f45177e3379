// MPI agreement on verdicts and seeds (verdict.hpp).
#include "equivalence/verdict.hpp"

#include <mpi.h>

namespace tandem::equivalence {
namespace {

bool mpi_running() { return mpi_world_size() > 1; }

}  // namespace

int mpi_world_size() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

bool agree_on_verdict(bool holds) {
  if (!mpi_running()) return holds;
  int local = holds ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

std::uint64_t agree_on_seed(std::uint64_t seed) {
  if (!mpi_running()) return seed;
  unsigned long long value = seed;
  MPI_Bcast(&value, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return static_cast<std::uint64_t>(value);
}

}  // namespace tandem::equivalence
