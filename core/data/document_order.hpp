// The order in which documents (Megatron sequences) enter the sample stream each epoch (SPEC 2,
// SPEC 12 --data-order). Our own generator and shuffle, so the order is the same on every
// compiler and standard library: std::shuffle and std::uniform_int_distribution are
// implementation-defined and are never used. The stream is specified in docs/DATA.md.
#pragma once

#include <cstdint>
#include <vector>

#include "core/random.hpp"

namespace tandem::data {

// The start state of the document-order stream of `epoch` under `seed` (docs/DATA.md):
// mix(mix(seed XOR kDocumentOrderTag) + epoch).
std::uint64_t document_order_state(std::uint64_t seed, std::uint64_t epoch);

// Fisher-Yates from the last element down: for i = n-1 .. 1, swap items[i] with
// items[below(i + 1)].
void fisher_yates_shuffle(std::vector<std::int64_t>& items, SplitMix64& stream);

// The positions 0..count-1 in the order epoch `epoch` visits them: identity when `shuffled` is
// false, else fisher_yates_shuffle of the identity with the stream of (seed, epoch).
std::vector<std::int64_t> epoch_order(std::int64_t count, bool shuffled, std::uint64_t seed,
                                      std::uint64_t epoch);

}  // namespace tandem::data
