// Small deterministic token streams for tests: documents of chosen lengths over a small alphabet,
// each ending with EOD, concatenated and cut into windows exactly as concat packing does (SPEC 2),
// with masks and positions from the shipped data::build_sample (SPEC 3).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/data/packing.hpp"
#include "core/init.hpp"

namespace tandem::testing {

// A stream of documents with the given lengths (EOD included in each length), token ids drawn
// from [0, alphabet) by a counter-based generator of `seed`.
inline std::vector<std::int32_t> document_stream(const std::vector<std::int64_t>& lengths,
                                                 std::int32_t alphabet, std::uint64_t seed) {
  std::vector<std::int32_t> stream;
  std::uint64_t counter = 0;
  const std::uint64_t state = splitmix64_mix(seed);
  for (const std::int64_t length : lengths) {
    for (std::int64_t i = 0; i + 1 < length; ++i) {
      stream.push_back(static_cast<std::int32_t>(init_stream_word(state, counter++) %
                                                 static_cast<std::uint64_t>(alphabet)));
    }
    if (length > 0) stream.push_back(kEodToken);
  }
  return stream;
}

// Concat packing of a stream that repeats forever: sample i covers [i*L, i*L + L + 1).
struct StreamSamples {
  std::vector<std::int32_t> stream;
  std::int64_t seq_length = 16;
  data::MaskRules rules;

  Sample operator()(std::int64_t global_index) const {
    std::vector<std::int32_t> window(static_cast<std::size_t>(seq_length + 1));  // [seq+1]
    const auto size = static_cast<std::int64_t>(stream.size());
    for (std::int64_t t = 0; t <= seq_length; ++t) {
      window[static_cast<std::size_t>(t)] =
          stream[static_cast<std::size_t>((global_index * seq_length + t) % size)];
    }
    return data::build_sample(global_index, window, rules);
  }
};

}  // namespace tandem::testing
