// numpy's legacy RandomState for Megatron's shuffles (see numpy_random.hpp).
#include "core/data/numpy_random.hpp"

#include <stdexcept>
#include <string>

namespace tandem::data {

namespace {

constexpr std::uint64_t kSeedLimit = std::uint64_t{1} << 32;  // numpy: seed in [0, 2^32)

std::uint32_t checked_seed(std::uint64_t seed) {
  if (seed >= kSeedLimit) {
    throw std::invalid_argument("--seed = " + std::to_string(seed) +
                                ": numpy.random.RandomState, which Megatron's GPTDataset seeds "
                                "with it, takes seeds in [0, 2^32); fix: give a smaller --seed");
  }
  return static_cast<std::uint32_t>(seed);
}

}  // namespace

NumpyRandomState::NumpyRandomState(std::uint64_t seed) : engine_(checked_seed(seed)) {}

std::uint64_t NumpyRandomState::next_uint64() {
  const std::uint64_t high = next_uint32();
  const std::uint64_t low = next_uint32();
  return (high << 32) | low;
}

std::uint64_t NumpyRandomState::random_interval(std::uint64_t max) {
  if (max == 0) return 0;
  std::uint64_t mask = max;  // smear the highest set bit down: the smallest 2^k - 1 >= max
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  std::uint64_t value = 0;
  if (max <= 0xFFFFFFFFu) {
    do {
      value = next_uint32() & mask;
    } while (value > max);
  } else {
    do {
      value = next_uint64() & mask;
    } while (value > max);
  }
  return value;
}

}  // namespace tandem::data
