// numpy's legacy numpy.random.RandomState, as far as Megatron's GPTDataset uses it: seeded with
// one integer, then shuffle() of 1-D arrays. Reproduced bit for bit so that `--data-order
// megatron` draws the very permutations Megatron Core draws (docs/DATA.md section 4).
//
// The generator is MT19937 (Matsumoto and Nishimura's init_genrand seeding and tempering), which
// the C++ standard fixes exactly as std::mt19937; numpy's legacy seeding of an integer seed in
// [0, 2^32) is that same init_genrand. What numpy adds is drawn here in its own words:
// random_interval (masked rejection) and the Fisher-Yates loop of RandomState.shuffle.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace tandem::data {

class NumpyRandomState {
 public:
  // numpy.random.RandomState(seed) for an integer seed; numpy refuses seeds outside [0, 2^32),
  // and so does this (std::invalid_argument naming the seed).
  explicit NumpyRandomState(std::uint64_t seed);

  // One 32-bit output of MT19937.
  std::uint32_t next_uint32() { return static_cast<std::uint32_t>(engine_()); }
  // numpy's next_uint64 for MT19937: the first 32-bit output is the high half.
  std::uint64_t next_uint64();
  // numpy's random_interval: uniform in [0, max] by rejection of (word & mask) > max, where mask
  // is the smallest 2^k - 1 >= max; 32-bit words while max < 2^32, 64-bit words above.
  std::uint64_t random_interval(std::uint64_t max);

  // RandomState.shuffle of a 1-D array: for i = n-1 down to 1, swap items[i] with
  // items[random_interval(i)]. The draws depend only on n, never on the element type.
  template <typename T>
  void shuffle(std::span<T> items) {
    for (std::size_t i = items.size(); i-- > 1;) {
      const auto j = static_cast<std::size_t>(random_interval(i));
      std::swap(items[i], items[j]);
    }
  }

 private:
  std::mt19937 engine_;  // exactly MT19937 (C++ [rand.predef]); never a distribution on top
};

}  // namespace tandem::data
