// Megatron's --split "a,b,c" (SPEC 2): contiguous ranges of sequences for train, valid and test.
// Weights are normalized, the book-ends are their running sums, and each book-end becomes a
// sequence index as int(round(bookend * N)) with Python's round (ties to even), exactly as
// Megatron's BlendedMegatronDatasetBuilder does. No --split: every sequence trains.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace tandem::data {

enum class DatasetSplit { train = 0, valid = 1, test = 2 };
std::string to_string(DatasetSplit split);

// A half-open range of sequence indices [begin, end).
struct SequenceRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  bool operator==(const SequenceRange&) const = default;
};

// Parses "a,b,c" (1 to 3 non-negative numbers, missing ones 0, sum > 0) into normalized weights.
// Throws tandem::ConfigError naming --split, the value, the rule and the fix.
std::array<double, 3> parse_split_weights(const std::string& split);

// The sequences of `which` among `sequence_count` under `split` (empty string: every sequence
// is train; valid and test are empty).
SequenceRange split_range(const std::string& split, std::int64_t sequence_count,
                          DatasetSplit which);

}  // namespace tandem::data
