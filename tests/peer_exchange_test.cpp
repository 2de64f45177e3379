// Point-to-point exchanges between the ranks of a thread group (the pipeline stages' transport on
// threads): order, both directions in one call, size mismatches, and a failing rank releasing a
// waiting receiver. The MPI twin of the first test: tests/mpi/peer_exchange_mpi_ranks.cpp.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "production/collectives/collectives.hpp"
#include "production/collectives/thread_group.hpp"
#include "tests/support/peer_exchange_checks.hpp"

namespace tandem::production {
namespace {

TEST(PeerExchange, ThreadRanksPassMessagesInOrderBothWays) {
  for (const int stages : {2, 3, 4}) {
    const auto group = make_thread_group(stages);
    run_thread_group(group, [&](int rank) { testing::check_peer_exchanges(*group[static_cast<std::size_t>(rank)]); });
  }
}

TEST(PeerExchange, AReceiverExpectingOtherBytesIsTold) {
  const auto group = make_thread_group(2);
  try {
    run_thread_group(group, [&](int rank) {
      float values[4] = {1.0f, 2.0f, 3.0f, 4.0f};
      if (rank == 0) group[0]->exchange_with_peers({.sends = {{values, 16, 1}}, .receives = {}});
      if (rank == 1) group[1]->exchange_with_peers({.sends = {}, .receives = {{values, 12, 0}}});
    });
    ADD_FAILURE() << "a 16-byte message was taken as 12 bytes";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(std::string(error.what()), "exchange_with_peers: rank 0 sent 16 bytes where 12 were expected");
  }
}

TEST(PeerExchange, AFailingSenderReleasesItsReceiver) {
  const auto group = make_thread_group(2);
  try {
    run_thread_group(group, [&](int rank) {
      float value = 0.0f;
      if (rank == 0) throw std::invalid_argument("stage 0 failed before sending");
      group[1]->exchange_with_peers({.sends = {}, .receives = {{&value, 4, 0}}});
    });
    ADD_FAILURE() << "the failure was not rethrown";
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()), "stage 0 failed before sending");
  }
}

TEST(PeerExchange, APeerOutsideTheGroupOrItselfIsRefused) {
  const auto group = make_thread_group(2);
  float value = 0.0f;
  EXPECT_THROW(group[0]->exchange_with_peers({.sends = {{&value, 4, 2}}, .receives = {}}), std::invalid_argument);
  EXPECT_THROW(group[0]->exchange_with_peers({.sends = {{&value, 4, 0}}, .receives = {}}), std::invalid_argument);
  EXPECT_THROW(group[0]->exchange_with_peers({.sends = {}, .receives = {{&value, 4, -1}}}), std::invalid_argument);
  EXPECT_THROW(single_rank_collectives()->exchange_with_peers({.sends = {{&value, 4, 1}}, .receives = {}}), std::logic_error);
  single_rank_collectives()->exchange_with_peers({});  // nothing to send or receive
}

}  // namespace
}  // namespace tandem::production
