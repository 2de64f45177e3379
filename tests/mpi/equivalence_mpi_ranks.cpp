// The equivalence harness with the production trainer's data-parallel ranks as MPI processes:
// ctest runs this under `mpirun -np 2` and `-np 4` (tests/CMakeLists.txt). Every rank draws the
// same cases (agree_on_seed), runs the reference itself and its own production rank, and agrees
// on each verdict before asserting (agree_on_verdict), so a failure shrinks on all ranks
// together. Started without mpirun it has nothing to run and says so.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "equivalence/gtest_registration.hpp"
#include "production/collectives/mpi.hpp"

int main(int argc, char** argv) {
  tandem::production::MpiSession session;  // MPI when mpirun started this process
  ::testing::InitGoogleTest(&argc, argv);
  if (session.world_size() > 1) {
    // The soak's entries (tests/CMakeLists.txt) set TANDEM_EQUIVALENCE_SOAK: a new seed each run,
    // both builds of the production trainer. TANDEM_EQUIVALENCE_TWIN=semantic runs only the
    // semantic build's ranks (its data plane moves doubles), fp32 only the users' build (default).
    const bool soak = std::getenv("TANDEM_EQUIVALENCE_SOAK") != nullptr;
    const char* chosen = std::getenv("TANDEM_EQUIVALENCE_TWIN");
    const bool semantic = chosen != nullptr && std::string(chosen) == "semantic";
    using tandem::equivalence::RankTransport;
    std::vector<tandem::equivalence::TwinKind> twins;
    if (soak || !semantic) twins.push_back(tandem::equivalence::production_twin(false, RankTransport::mpi));
    if (soak || semantic) twins.push_back(tandem::equivalence::production_semantic_twin(RankTransport::mpi));
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
