// The Trainers of one process's data-parallel ranks (local_ranks.hpp).
#include "production/local_ranks.hpp"

#include <map>
#include <utility>

#include "core/rank_grid.hpp"
#include "core/run_layout.hpp"
#include "production/collectives/mpi.hpp"
#include "production/collectives/staged.hpp"
#ifdef TANDEM_HAVE_CUDA_BACKEND
#include "production/collectives/nccl.hpp"
#include "production/cuda/device.hpp"
#endif

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

LocalRanks::LocalRanks(const RunConfig& config, const SampleProvider& samples, const ProductionOptions& base,
                       Transport transport) {
  const auto replicas = static_cast<int>(config.parallel.data_parallel);
  const auto tensor_ranks = static_cast<int>(config.parallel.tensor_parallel);
  const auto stages = static_cast<int>(config.parallel.pipeline_parallel);
  const int ranks = replicas * tensor_ranks * stages;
  // "(TP 2 x DP 2)" / "(TP 2 x PP 2 x DP 2)" for the description when more than DP is split.
  std::string layout;
  if (tensor_ranks > 1 || stages > 1) {
    layout = " (TP " + std::to_string(tensor_ranks) + (stages > 1 ? " x PP " + std::to_string(stages) : "") +
             " x DP " + std::to_string(replicas) + ")";
  }
  ProductionOptions shared = base;
  // One layout for every rank of this process (each Trainer would otherwise derive its own copy).
  if (!shared.layout) shared.layout = std::make_shared<const RunLayout>(config);
  const RankGrid& grid = shared.layout->grid;
  if (transport == Transport::mpi && ranks > 1) {
    // This process is one rank of the launched world; its groups are the rank grid's
    // (core/rank_grid.hpp), MPI sub-communicators made in the Trainer's order on every rank.
    shared.world = [](Backend&) { return make_mpi_collectives(); };
    const auto group_of = [run_layout = shared.layout](RankGroupKind kind) -> CollectivesFactory {
      return [run_layout, kind](Backend&) { return make_mpi_group_collectives(run_layout->grid, kind); };
    };
    shared.collectives = group_of(RankGroupKind::data);
    shared.tensor_parallel = group_of(RankGroupKind::tensor);
    shared.pipeline = group_of(RankGroupKind::pipeline);
    shared.embedding = group_of(RankGroupKind::embedding);
    transport_text_ = ", rank of " + std::to_string(ranks) + " MPI ranks" + layout;
  } else if (ranks > 1) {
    // The rank grid's groups (core/rank_grid.hpp, Megatron's order: TP fastest), one thread group
    // each, its members numbered as the grid lists them.
    group_ = make_thread_group(ranks);
    std::map<std::pair<RankGroupKind, std::int64_t>, std::vector<std::shared_ptr<Collectives>>> made;
    const auto member = [&](RankGroupKind kind, int rank) -> std::shared_ptr<Collectives> {
      if (grid.group_index(kind, rank) < 0) return nullptr;  // an embedding group's middle stage
      auto& threads = made[{kind, grid.group_index(kind, rank)}];
      if (threads.empty()) threads = make_thread_group(static_cast<int>(grid.members(kind, rank).size()));
      return threads[static_cast<std::size_t>(grid.rank_in_group(kind, rank))];
    };
    for (int rank = 0; rank < ranks; ++rank) {
      rank_groups_.push_back({group_[static_cast<std::size_t>(rank)], member(RankGroupKind::data, rank),
                              member(RankGroupKind::tensor, rank), member(RankGroupKind::pipeline, rank),
                              member(RankGroupKind::embedding, rank)});
    }
    transport_text_ = ", " + std::to_string(ranks) + " ranks on threads" + layout;
  }
  trainers_.resize(group_.empty() ? 1 : group_.size());
#ifdef TANDEM_HAVE_CUDA_BACKEND
  // cuda ranks on threads: a device each and NCCL over the thread groups (its control plane) where
  // the devices suffice; otherwise all on the base device, their exchanges staged through host
  // memory (collectives/staged.hpp: NCCL refuses one device twice in a communicator).
  own_devices_ = !group_.empty() && base.device == Device::cuda && ranks <= tandem::cuda::device_count();
#endif
  if (own_devices_) transport_text_ += ", a device each, NCCL";
  auto build = [&](int rank) {
    ProductionOptions mine = shared;
    if (own_devices_) mine.device_index = rank;
    if (!group_.empty()) {
      const auto on = [own_devices = own_devices_](std::shared_ptr<Collectives> member) -> CollectivesFactory {
        return [member, own_devices](Backend& backend) -> std::shared_ptr<Collectives> {
          if (!member || backend.device() != Device::cuda) return member;
#ifdef TANDEM_HAVE_CUDA_BACKEND
          if (own_devices) return make_nccl_collectives(backend, member);
#endif
          (void)own_devices;
          return make_host_staged_collectives(backend, member);
        };
      };
      const auto& groups = rank_groups_[static_cast<std::size_t>(rank)];
      mine.world = on(groups[0]);
      mine.collectives = on(groups[1]);
      mine.tensor_parallel = on(groups[2]);
      mine.pipeline = on(groups[3]);
      mine.embedding = on(groups[4]);
    }
    trainers_[static_cast<std::size_t>(rank)] = std::make_unique<Trainer>(config, samples, mine);
  };
  if (group_.empty()) {
    build(0);
  } else {
    run_ranks(build);  // the Trainers' constructors exchange (collectives' setup)
  }
}

void LocalRanks::run_ranks(const std::function<void(int rank)>& body) const {
  run_thread_group(group_, [&](int rank) {
    try {
#ifdef TANDEM_HAVE_CUDA_BACKEND
      if (own_devices_) tandem::cuda::use_device(rank);  // a fresh thread's device is 0
#endif
      body(rank);
    } catch (...) {
      abandon_thread_groups(rank_groups_[static_cast<std::size_t>(rank)]);
      throw;
    }
  });
}

}  // namespace tandem::production
