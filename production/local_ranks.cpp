// The Trainers of one process's data-parallel ranks (local_ranks.hpp).
#include "production/local_ranks.hpp"

#include "production/collectives/mpi.hpp"

namespace tandem::production {

LocalRanks::LocalRanks(const RunConfig& config, const SampleProvider& samples, const ProductionOptions& base,
                       Transport transport) {
  const auto ranks = static_cast<int>(config.parallel.data_parallel);
  ProductionOptions shared = base;
  if (transport == Transport::mpi && ranks > 1) {
    shared.collectives = [](Backend&) { return make_mpi_collectives(); };
    transport_text_ = ", rank of " + std::to_string(ranks) + " MPI ranks";
  } else if (ranks > 1) {
    group_ = make_thread_group(ranks);
    transport_text_ = ", " + std::to_string(ranks) + " ranks on threads";
  }
  trainers_.resize(group_.empty() ? 1 : group_.size());
  auto build = [&](int rank) {
    ProductionOptions mine = shared;
    if (!group_.empty()) {
      mine.collectives = [member = group_[static_cast<std::size_t>(rank)]](Backend&) { return member; };
    }
    trainers_[static_cast<std::size_t>(rank)] = std::make_unique<Trainer>(config, samples, mine);
  };
  if (group_.empty()) {
    build(0);
  } else {
    run_thread_group(group_, build);  // the Trainers' constructors exchange (collectives' setup)
  }
}

}  // namespace tandem::production
