// Megatron's --split arithmetic (see split.hpp).
#include "core/data/split.hpp"

#include <cmath>
#include <cstdlib>

#include "core/config_issue.hpp"

namespace tandem::data {

std::string to_string(DatasetSplit split) {
  switch (split) {
    case DatasetSplit::train: return "train";
    case DatasetSplit::valid: return "valid";
    case DatasetSplit::test: return "test";
  }
  return "?";
}

std::array<double, 3> parse_split_weights(const std::string& split) {
  auto reject = [&](const std::string& rule) -> std::array<double, 3> {
    throw ConfigError({{"--split", split, rule,
                        "give 1 to 3 comma-separated non-negative weights, e.g. 969,30,1"}});
  };
  std::array<double, 3> weights{0.0, 0.0, 0.0};
  std::size_t count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = split.find(',', start);
    const std::string field =
        split.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (count == weights.size()) return reject("has more than 3 weights");
    if (field.empty()) return reject("has an empty weight");
    char* parsed_end = nullptr;
    const double weight = std::strtod(field.c_str(), &parsed_end);
    if (parsed_end != field.c_str() + field.size() || !std::isfinite(weight)) {
      return reject("weight \"" + field + "\" is not a number");
    }
    if (weight < 0.0) return reject("weight " + field + " is negative");
    weights[count++] = weight;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const double total = weights[0] + weights[1] + weights[2];
  if (!(total > 0.0)) return reject("weights sum to 0");
  for (double& weight : weights) weight /= total;  // Megatron's normalize()
  return weights;
}

SequenceRange split_range(const std::string& split, std::int64_t sequence_count,
                          DatasetSplit which) {
  if (split.empty()) {
    // SPEC 2: without --split the whole dataset trains (unlike Megatron's 969,30,1).
    return which == DatasetSplit::train ? SequenceRange{0, sequence_count} : SequenceRange{};
  }
  const auto weights = parse_split_weights(split);
  // Book-ends as Megatron's convert_split_vector_to_split_matrix: running sums from 0.
  std::array<double, 4> bookends{0.0, 0.0, 0.0, 0.0};
  for (std::size_t i = 0; i < weights.size(); ++i) bookends[i + 1] = bookends[i] + weights[i];
  const auto index = static_cast<std::size_t>(which);
  if (bookends[index] == bookends[index + 1]) return SequenceRange{};  // Megatron: None
  // int(round(x * N)): std::nearbyint in the default rounding mode rounds ties to even, as
  // Python's round does.
  const auto total = static_cast<double>(sequence_count);
  const auto begin = static_cast<std::int64_t>(std::nearbyint(bookends[index] * total));
  const auto end = static_cast<std::int64_t>(std::nearbyint(bookends[index + 1] * total));
  return SequenceRange{begin, end};
}

}  // namespace tandem::data
