// `tandem train --engine production`: the run around the production trainer, as
// reference/run.hpp is around the reference — data, resume, the log's header and iteration
// records, progress lines, checkpoints (F32), the skip limit, --exit-interval. With several
// data-parallel ranks every rank runs this; rank 0 builds the data first, writes the log, the
// progress lines and the checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/train/run_support.hpp"
#include "core/train/train_options.hpp"
#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/mpi.hpp"
#include "production/trainer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// What a finished run reports (core/train/run_support.hpp), and the backend that ran it.
struct RunSummary : tandem::RunSummary {
  Device device = Device::cpu;
};

// The device a run uses: --device when given; otherwise cuda when the cuda backend is built and
// a device answers, else cpu. Throws std::runtime_error for an unknown name.
Device choose_device(const std::string& requested);

// How this process joins the run: one rank by default; under a launcher, cli/train_command.cpp
// sets it from the MPI session (production/collectives/mpi.hpp).
struct RankSetup {
  int rank = 0;
  int local_rank = 0;                      // selects the cuda device: local_rank % devices
  int local_size = 1;                      // this node's ranks
  std::shared_ptr<const RunLayout> layout;  // the run's (core/run_layout.hpp); null: derived from the config
  CollectivesFactory collectives;          // its data-parallel group; empty: one rank
  CollectivesFactory tensor_parallel;      // its tensor-parallel group; empty: TP 1
  CollectivesFactory world;                // every rank; empty: the data-parallel group
  CollectivesFactory pipeline;             // its pipeline group; empty: PP 1
  CollectivesFactory embedding;            // first and last stage (null on a middle one); empty: PP 1
  std::function<void()> barrier = [] {};   // every rank waits here
  // Every rank's text, in rank order (host memory; before the Trainer's collectives exist).
  std::function<std::vector<std::string>(const std::string&)> all_gather_text = [](const std::string& text) {
    return std::vector<std::string>{text};
  };
};

// This process's RankSetup when a launcher started the world (session active): its groups in
// Megatron's rank grid of config.parallel (core/rank_grid.hpp, derived once: RankSetup::layout), each an MPI sub-communicator on
// the cpu backend, or an NCCL communicator with that sub-communicator as its control plane on cuda
// (staged through host memory over MPI instead when a node has more ranks than devices, so that
// ranks share a device: NCCL refuses that; collectives/staged.hpp).
// Throws std::invalid_argument when the launched world is not TP x CP x DP x PP.
RankSetup launched_rank_setup(const MpiSession& session, const RunConfig& config);

// Trains config.schedule.train_samples / GBS iterations in all (resuming from --load when given),
// writing progress to `out`. Throws std::runtime_error on a failure (the skip limit, after its
// final checkpoint; --device cuda without the cuda backend) and ConfigError on a bad resume.
RunSummary run_production_training(const RunConfig& config, const TrainOptions& options,
                                   std::ostream& out, const RankSetup& ranks = {});

}  // namespace tandem::production
