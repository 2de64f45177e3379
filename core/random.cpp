// SplitMix64 (random.hpp).
#include "core/random.hpp"

#include <stdexcept>

namespace tandem {

std::uint64_t splitmix64_mix(std::uint64_t word) {
  word = (word ^ (word >> 30)) * 0xBF58476D1CE4E5B9ULL;
  word = (word ^ (word >> 27)) * 0x94D049BB133111EBULL;
  return word ^ (word >> 31);
}

std::uint64_t SplitMix64::next() {
  state_ += kSplitMixGamma;
  return splitmix64_mix(state_);
}

std::uint64_t SplitMix64::below(std::uint64_t bound) {
  if (bound == 0) throw std::invalid_argument("SplitMix64::below: bound must be at least 1");
  // 2^64 mod bound, computed in 64 bits: (2^64 - bound) mod bound.
  const std::uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const std::uint64_t word = next();
    if (word >= threshold) return word % bound;
  }
}

}  // namespace tandem
