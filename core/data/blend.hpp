// Blended datasets, Megatron's `--data-path W1 P1 W2 P2 ...` (docs/DATA.md section 9): how the
// values of --data-path become prefixes and weights, and which dataset each blend sample reads.
//
// The rule (our reading of Megatron Core 0.19's BlendedDataset and its C++ helper
// build_blending_indices in megatron/core/datasets/helpers.cpp). With normalized weights
// w_0 .. w_{K-1} and c_d the number of samples taken from dataset d so far (all 0 at the start),
// blend sample i (i = 0, 1, 2, ...) comes from the dataset with the largest error
//
//     e_d = w_d * max(i, 1) - c_d          (in double precision)
//
// and the lowest d among equal errors (a later dataset wins only with a strictly larger error).
// It is sample c_d of dataset d, and c_d then grows by 1. The target is w_d * max(i, 1), not
// w_d * (i + 1): samples 0 and 1 are both chosen against one sample's worth, exactly as Megatron
// does. The choice depends only on the weights and i, so the blend is a pure function of them:
// resuming at consumed sample n reads what a straight run reads. Megatron sizes each dataset to
// ceil(ceil(S w_d) (1 + surplus)) samples for a run of S samples; tandem's datasets are endless
// (epoch e + 1 follows epoch e, SPEC 2), so a dataset never runs dry and no size is needed.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace tandem::data {

// --data-path's values as Megatron's get_blend_from_list reads them, with tandem's stricter
// errors (docs/DATA.md section 9):
//   - none: the embedded corpus (an empty result);
//   - one value: that prefix, no weight;
//   - W1 P1 W2 P2 ...: an even count whose even positions (0, 2, ...) are all numbers: a blend;
//     each weight must be a finite number > 0; weights are normalized to sum 1 (w / sum, the sum
//     taken left to right);
//   - P1 P2 ...: several values none of which is a number: a blend weighted by each dataset's
//     samples per epoch (the weights are left absent here and fixed when the datasets open).
// Anything else (an odd count holding numbers, a weight position holding a prefix, a prefix
// position holding a number, a bad weight, an empty prefix) throws tandem::ConfigError naming
// --data-path, the value, the rule and the fix. A "number" is a value std::strtod reads whole.
std::vector<DataPathEntry> parse_data_path(const std::vector<std::string>& values);

// Weights divided by their sum (Megatron's normalize). Each weight must be finite and > 0.
std::vector<double> normalize_weights(const std::vector<double>& weights);

// Where blend sample i comes from.
struct BlendPosition {
  std::int64_t dataset = 0;         // d, the index of the dataset in --data-path order
  std::int64_t dataset_sample = 0;  // the sample of dataset d it is (c_d before the choice)
  bool operator==(const BlendPosition&) const = default;
};

// The blending index of the rule above, for any i >= 0. Thread-safe. The counts c_d are saved
// every kCountStride samples as the index is first walked, so a lookup replays at most
// kCountStride choices; memory is K x 8 bytes per kCountStride samples.
class BlendingIndex {
 public:
  // `weights`: normalized (normalize_weights), at least one.
  explicit BlendingIndex(std::vector<double> weights);

  BlendPosition at(std::int64_t blend_sample) const;
  const std::vector<double>& weights() const { return weights_; }

  static constexpr std::int64_t kCountStride = 4096;  // samples between saved counts

 private:
  // The dataset blend sample i comes from, given the counts before it; `counts` then grows.
  std::int64_t choose(std::int64_t blend_sample, std::vector<std::int64_t>& counts) const;

  std::vector<double> weights_;  // [K] normalized
  mutable std::mutex mutex_;
  // [saved x K] the counts c_d before blend sample s x kCountStride, s = 0, 1, ...
  mutable std::vector<std::int64_t> saved_counts_;
};

}  // namespace tandem::data
