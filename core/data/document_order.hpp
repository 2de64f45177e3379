// The order in which documents (Megatron sequences) enter the sample stream each epoch (SPEC 2,
// SPEC 12 --data-order). Our own generator and shuffle, so the order is the same on every
// compiler and standard library: std::shuffle and std::uniform_int_distribution are
// implementation-defined and are never used. The stream is specified in docs/DATA.md.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::data {

// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64-bit words.
std::uint64_t splitmix64_mix(std::uint64_t value);

// A counter-based SplitMix64 stream: next() adds the golden-ratio increment to the state and
// returns the mixed state. Two streams with the same start state give the same words.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t state) : state_(state) {}
  std::uint64_t next();
  // Unbiased integer in [0, bound), bound >= 1: words below (2^64 mod bound) are rejected and
  // drawn again, then the word is reduced mod bound (docs/DATA.md).
  std::uint64_t below(std::uint64_t bound);

 private:
  std::uint64_t state_;
};

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
