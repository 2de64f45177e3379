// The one random-number primitive of tandem: SplitMix64 (Steele, Lea, Flood 2014). Every stream
// (initialization, document order, audit sampling) is a counter-based use of it, seeded from
// --seed and a stream tag, so results never depend on the standard library's distributions.
// The streams built on it are specified in docs/MODEL.md (init) and docs/DATA.md (order).
#pragma once

#include <cstdint>

namespace tandem {

// SplitMix64's increment: the odd 64-bit golden-ratio constant.
inline constexpr std::uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ULL;

// SplitMix64's output function (finalizer): a bijection on 64-bit words.
std::uint64_t splitmix64_mix(std::uint64_t word);

// A SplitMix64 stream: next() adds the increment to the state and mixes it.
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

}  // namespace tandem
