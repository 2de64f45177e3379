// MPI ranks: whether a launcher (mpirun, srun) started this process as one of several, the
// process's MPI session, and the collectives over MPI_COMM_WORLD and over the rank grid's groups
// (sub-communicators) in host memory (the cpu backend: CI and every machine without a GPU run the
// multi-rank trainer this way).
#pragma once

#include <memory>
#include <string>

#include "core/rank_grid.hpp"
#include "production/arithmetic.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// True when the environment says an MPI launcher started this process: Open MPI's mpirun
// (OMPI_COMM_WORLD_SIZE), a PMIx launcher such as `srun --mpi=pmix` or mpirun (PMIX_RANK), or a
// PMI-1/2 launcher such as `srun --mpi=pmi2` or MPICH's hydra (PMI_RANK). A process started any
// other way is one rank and never initializes MPI.
bool launched_by_mpi_launcher();

// MPI for this process: MPI_Init_thread when launched_by_mpi_launcher() (or when `force`), and
// MPI_Finalize when the session ends. Errors on MPI_COMM_WORLD return codes, which become
// std::runtime_error naming the call. One session per process.
class MpiSession {
 public:
  explicit MpiSession(bool force = false);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool active() const { return active_; }  // MPI initialized by this session
  int rank() const { return rank_; }         // 0 when not active
  int world_size() const { return world_size_; }  // 1 when not active
  int local_rank() const { return local_rank_; }  // rank among this node's ranks (cuda device)
  int local_size() const { return local_size_; }  // this node's ranks (1 when not active)
  void barrier() const;
  // Ends every rank (MPI_Abort) with `exit_code`: a failure on one rank would otherwise leave
  // the others waiting in a collective forever.
  [[noreturn]] void abort(int exit_code) const;

 private:
  bool active_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

// The collectives of MPI_COMM_WORLD with host memory (requires an active session). Counts above
// MPI's int range are refused with an error naming the exchange.
std::shared_ptr<Collectives> make_mpi_collectives();

// The collectives of this rank's group of `kind` in `grid` (core/rank_grid.hpp): an MPI
// sub-communicator split from MPI_COMM_WORLD, its ranks numbered as grid.members lists them.
// Collective: every rank of the world calls it for the same kind, in the same order. nullptr for a
// rank in no group of the kind (an embedding group on a middle pipeline stage). Throws
// std::invalid_argument when the grid's world is not the launched one.
std::shared_ptr<Collectives> make_mpi_group_collectives(const RankGrid& grid, RankGroupKind kind);

}  // namespace tandem::production
