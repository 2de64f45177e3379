// The equivalence harness with the production trainer's data-parallel ranks as MPI processes:
// ctest runs this under `mpirun -np 2` and `-np 4` (tests/CMakeLists.txt). Every rank draws the
// same cases (agree_on_seed), runs the reference itself and its own production rank, and agrees
// on each verdict before asserting (agree_on_verdict), so a failure shrinks on all ranks
// together. Started without mpirun it has nothing to run and says so.
#include <cstdlib>
#include <iostream>
#include <vector>

#include <gtest/gtest.h>

#include "equivalence/gtest_registration.hpp"
#include "production/collectives/mpi.hpp"

int main(int argc, char** argv) {
  tandem::production::MpiSession session;  // MPI when mpirun started this process
  ::testing::InitGoogleTest(&argc, argv);
  if (session.world_size() > 1) {
    // The soak's entries (tests/CMakeLists.txt) set TANDEM_EQUIVALENCE_SOAK: a new seed each run,
    // and the semantic build's ranks too (the default suite runs it on threads).
    const bool soak = std::getenv("TANDEM_EQUIVALENCE_SOAK") != nullptr;
    std::vector<tandem::equivalence::TwinKind> twins = {
        tandem::equivalence::production_twin(false, tandem::equivalence::RankTransport::mpi)};
    if (soak) twins.push_back(tandem::equivalence::production_semantic_twin(tandem::equivalence::RankTransport::mpi));
    tandem::equivalence::register_equivalence_properties("EquivalenceMpi", soak, twins);
  } else {
    tandem::equivalence::register_check("EquivalenceMpi", "NeedsMpirun", [] {
      GTEST_SKIP() << "start under mpirun -np N (N > 1): the production twin's ranks are the MPI ranks";
    });
  }
  if (session.rank() != 0) {  // rank 0 reports; every rank holds the same verdicts
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    std::cout.setstate(std::ios::failbit);
  }
  return RUN_ALL_TESTS();
}
