// The Trainers of the ranks that one process runs, for the tests and the equivalence harness
// (tandem train runs one rank per process instead): either one Trainer (one rank, or this
// process's rank when mpirun started it) or one Trainer per rank of TP x PP x DP on threads
// (collectives/thread_group.hpp: a group for every rank, and one per tensor-parallel, data-parallel,
// pipeline and embedding group, Megatron's order: rank = tp + TP x (dp + DP x pp)). each() runs a body on every rank
// held, together, as the Trainer's collective calls require.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "production/arithmetic.hpp"
#include "production/collectives/collectives.hpp"
#include "production/collectives/thread_group.hpp"
#include "production/trainer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

class LocalRanks {
 public:
  enum class Transport { threads, mpi };

  // config.parallel's TP x PP x DP ranks over `transport` (mpi: this process is one of them; one rank
  // needs no transport). `base` is every rank's options; its collectives are set here.
  LocalRanks(const RunConfig& config, const SampleProvider& samples, const ProductionOptions& base,
             Transport transport);

  // body(trainer, index) on every rank this process holds, on their threads when there are
  // several; index is the rank's place among those held, [0, size()): its rank on threads, 0 for
  // the one rank of an MPI process.
  template <class Body>
  void each(Body&& body) {
    if (group_.empty()) return body(*trainers_.front(), 0);
    run_ranks([&](int rank) { body(*trainers_[static_cast<std::size_t>(rank)], rank); });
  }
  template <class Body>
  void each(Body&& body) const {
    if (group_.empty()) return body(static_cast<const Trainer&>(*trainers_.front()), 0);
    run_ranks([&](int rank) { body(static_cast<const Trainer&>(*trainers_[static_cast<std::size_t>(rank)]), rank); });
  }

  // The first rank this process holds (rank 0 on threads); its records and state stand for all.
  Trainer& front() { return *trainers_.front(); }
  const Trainer& front() const { return *trainers_.front(); }
  // The rank at `index` (each()'s second argument), for calls that exchange nothing.
  Trainer& at(std::size_t index) { return *trainers_.at(index); }
  std::size_t size() const { return trainers_.size(); }
  // For descriptions: "", ", 2 ranks on threads" or ", rank of 4 MPI ranks".
  const std::string& transport_text() const { return transport_text_; }
  bool on_threads() const { return !group_.empty(); }

 private:
  // body(rank) on every rank's thread; a rank that fails abandons all its groups.
  void run_ranks(const std::function<void(int rank)>& body) const;

  std::vector<std::shared_ptr<Collectives>> group_;  // [ranks] every rank; empty: one rank in this process
  std::vector<std::vector<std::shared_ptr<Collectives>>> rank_groups_;  // [ranks] {world, dp, tp, pp, embedding} members (embedding null on a middle stage)
  std::vector<std::unique_ptr<Trainer>> trainers_;   // [ranks held]
  std::string transport_text_;
  bool own_devices_ = false;  // cuda ranks on threads, rank r on device r, over NCCL
};

}  // namespace tandem::production
