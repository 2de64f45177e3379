// Point-to-point exchanges between MPI ranks (production/collectives/mpi.cpp), under
// `mpirun -np 4` (tests/CMakeLists.txt): over MPI_COMM_WORLD as one 4-stage pipeline, then over
// the pipeline groups of a TP 2 x PP 2 grid (sub-communicators, stages numbered as the grid lists
// them). The checks are the thread group's (tests/support/peer_exchange_checks.hpp).
#include <iostream>

#include <gtest/gtest.h>

#include "core/rank_grid.hpp"
#include "production/collectives/mpi.hpp"
#include "tests/support/peer_exchange_checks.hpp"

namespace {
int world_size = 1;
}

TEST(PeerExchangeMpi, WorldRanksPassMessagesInOrderBothWays) {
  if (world_size < 2) GTEST_SKIP() << "start under mpirun -np N (N > 1)";
  const auto world = tandem::production::make_mpi_collectives();
  tandem::testing::check_peer_exchanges(*world);
}

TEST(PeerExchangeMpi, PipelineGroupsOfTheRankGridPassMessagesInOrderBothWays) {
  if (world_size != 4) GTEST_SKIP() << "start under mpirun -np 4 (TP 2 x PP 2)";
  const tandem::RankGrid grid(2, 1, 1, 2);
  const auto pipeline = tandem::production::make_mpi_group_collectives(grid, tandem::RankGroupKind::pipeline);
  ASSERT_EQ(pipeline->size(), 2);
  tandem::testing::check_peer_exchanges(*pipeline);
}

int main(int argc, char** argv) {
  tandem::production::MpiSession session;  // MPI when mpirun started this process
  world_size = session.world_size();
  ::testing::InitGoogleTest(&argc, argv);
  if (session.rank() != 0) {  // rank 0 reports; a failing rank's assertion still fails its exit
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
