// The point-to-point exchange of Collectives (production/collectives/collectives.hpp) as pipeline
// stages use it, run by every rank of a group: shared by the thread-group test
// (tests/peer_exchange_test.cpp) and the MPI one (tests/mpi/peer_exchange_mpi_ranks.cpp), so both
// transports are held to the same expectations. Exact comparisons: bytes move, nothing is computed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "production/collectives/collectives.hpp"

namespace tandem::testing {

// What stage `from` sends as its message `index` to stage `to`: distinct per (from, to, index, i).
inline float peer_value(int from, int to, int index, std::int64_t i) {
  return static_cast<float>(from * 1000000 + to * 10000 + index * 100) + static_cast<float>(i) / 8.0f;
}

// Every rank of `group` as one pipeline of size() stages: three messages forward through every
// boundary (the first stage sends, the last receives), then three backward, then each boundary's
// two ranks send to each other in one call (1F1B's steady state: send forward, receive backward).
inline void check_peer_exchanges(production::Collectives& group) {
  const int rank = group.rank();
  const int size = group.size();
  const int next = rank + 1 < size ? rank + 1 : -1;
  const int previous = rank > 0 ? rank - 1 : -1;
  constexpr std::int64_t kCount = 37;  // floats per message: not a round number of bytes
  const auto message = [&](int from, int to, int index) {
    std::vector<float> values(kCount);
    for (std::int64_t i = 0; i < kCount; ++i) values[static_cast<std::size_t>(i)] = peer_value(from, to, index, i);
    return values;
  };
  const auto expect_message = [&](const std::vector<float>& received, int from, int index) {
    for (std::int64_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(received[static_cast<std::size_t>(i)], peer_value(from, rank, index, i))
          << "rank " << rank << " from " << from << " message " << index << " element " << i;
    }
  };
  constexpr std::int64_t kBytes = kCount * static_cast<std::int64_t>(sizeof(float));
  // Forward: each stage receives message k from the previous stage, then sends its own k onwards.
  for (int index = 0; index < 3; ++index) {
    std::vector<float> received(kCount, -1.0f);
    if (previous != -1) {
      group.exchange_with_peers({.sends = {}, .receives = {{received.data(), kBytes, previous}}});
      expect_message(received, previous, index);
    }
    if (next != -1) {
      const std::vector<float> sent = message(rank, next, index);
      group.exchange_with_peers({.sends = {{sent.data(), kBytes, next}}, .receives = {}});
    }
  }
  // Backward: three sends in a row before any receive (the receiver takes them in order).
  if (previous != -1) {
    for (int index = 0; index < 3; ++index) {
      const std::vector<float> sent = message(rank, previous, 10 + index);
      group.exchange_with_peers({.sends = {{sent.data(), kBytes, previous}}, .receives = {}});
    }
  }
  if (next != -1) {
    for (int index = 0; index < 3; ++index) {
      std::vector<float> received(kCount, -1.0f);
      group.exchange_with_peers({.sends = {}, .receives = {{received.data(), kBytes, next}}});
      expect_message(received, next, 10 + index);
    }
  }
  // Both ways at once across each boundary (even boundaries first, then odd ones).
  for (int parity = 0; parity < 2; ++parity) {
    int peer = -1;
    if (rank % 2 == parity && next != -1) peer = next;
    if (rank % 2 != parity && previous != -1) peer = previous;
    if (peer == -1) continue;
    const std::vector<float> sent = message(rank, peer, 20 + parity);
    std::vector<float> received(kCount, -1.0f);
    group.exchange_with_peers({{{sent.data(), kBytes, peer}}, {{received.data(), kBytes, peer}}});
    expect_message(received, peer, 20 + parity);
  }
  // Two messages each way across each boundary in one call, taken in the order sent (the
  // interleaved schedule's step: an activation and a gradient; with two stages both go to the
  // one peer), then each rank's messages to both neighbours and from both in one call.
  for (int parity = 0; parity < 2; ++parity) {
    int peer = -1;
    if (rank % 2 == parity && next != -1) peer = next;
    if (rank % 2 != parity && previous != -1) peer = previous;
    if (peer == -1) continue;
    const std::vector<float> first = message(rank, peer, 30 + parity);
    const std::vector<float> second = message(rank, peer, 40 + parity);
    std::vector<float> received_first(kCount, -1.0f);
    std::vector<float> received_second(kCount, -1.0f);
    group.exchange_with_peers({{{first.data(), kBytes, peer}, {second.data(), kBytes, peer}},
                               {{received_first.data(), kBytes, peer}, {received_second.data(), kBytes, peer}}});
    expect_message(received_first, peer, 30 + parity);
    expect_message(received_second, peer, 40 + parity);
  }
  {
    production::PeerExchange both;
    std::vector<std::vector<float>> sent;
    std::vector<std::vector<float>> received;
    for (const int peer : {next, previous}) {
      if (peer == -1) continue;
      sent.push_back(message(rank, peer, 50));
      received.emplace_back(kCount, -1.0f);
    }
    std::size_t i = 0;
    for (const int peer : {next, previous}) {
      if (peer == -1) continue;
      both.sends.push_back({sent[i].data(), kBytes, peer});
      both.receives.push_back({received[i].data(), kBytes, peer});
      ++i;
    }
    group.exchange_with_peers(both);
    i = 0;
    for (const int peer : {next, previous}) {
      if (peer != -1) expect_message(received[i++], peer, 50);
    }
  }
  group.barrier();
}

}  // namespace tandem::testing
