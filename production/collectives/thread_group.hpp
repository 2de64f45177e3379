// Several data-parallel ranks inside one process, one thread each, exchanging host memory: the
// tests and the equivalence harness run the multi-rank production trainer (cpu backend) this way
// without a launcher. The exchanges are the same byte moves MPI makes (collectives.hpp), so a
// thread-group run and an `mpirun` run of the same ranks give the same bits.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "production/arithmetic.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// `size` collectives, element r for rank r; each must be used from its own thread, and every
// rank must make the same calls in the same order.
std::vector<std::shared_ptr<Collectives>> make_thread_group(int size);

// Runs body(rank) on `size` threads of one thread group and joins them. When a rank throws, the
// group is abandoned (the others' waiting collectives throw too, so nobody deadlocks) and the
// first rank's exception, by rank, is rethrown here.
void run_thread_group(const std::vector<std::shared_ptr<Collectives>>& group,
                      const std::function<void(int rank)>& body);

// Abandons the groups of these members (each of make_thread_group's collectives): every rank
// waiting in any of them, and every later call, throws "thread group abandoned". For ranks that
// belong to several groups (tensor x data parallel on threads): when one fails, all its groups go.
void abandon_thread_groups(const std::vector<std::shared_ptr<Collectives>>& members);

}  // namespace tandem::production
