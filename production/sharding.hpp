// The data-parallel partition of the flat parameter buffer (core/model_layout.hpp) — Megatron's
// distributed optimizer: rank r owns the contiguous shard [r*S, min((r+1)*S, N)) of the main
// weights, main gradients (after the reduce-scatter), m and v. S is a multiple of the norm's
// block (trainer.hpp kNormBlockElements), so every squared-norm block lies inside one shard and
// the norm sums the same blocks in the same order for every DP size (SPEC 6).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "production/kernels/optimizer.hpp"

namespace tandem::production {

struct FlatShards {
  std::int64_t total = 0;           // N: parameter elements
  std::int64_t ranks = 1;           // DP
  std::int64_t shard_elements = 0;  // S: a multiple of the alignment, ranks x S >= N

  // Elements of the exchanged buffers: the flat buffer padded with zeros to ranks x S.
  std::int64_t padded() const { return ranks * shard_elements; }
  std::int64_t begin(std::int64_t rank) const { return std::min(rank * shard_elements, total); }
  // Elements of rank's shard that hold parameters (the last shards may be short, or empty).
  std::int64_t count(std::int64_t rank) const {
    return std::clamp<std::int64_t>(total - rank * shard_elements, 0, shard_elements);
  }
  std::int64_t owner(std::int64_t flat) const { return flat / shard_elements; }
};

// S = the smallest multiple of `alignment` with ranks x S >= total (at least one alignment).
FlatShards make_flat_shards(std::int64_t total, std::int64_t ranks, std::int64_t alignment);

// The decay segments (trainer.hpp decay_segments) that cover [begin, begin + count), cut at its
// ends and made relative to `begin` (AdamW's range).
std::vector<DecaySegment> segments_in_range(const std::vector<DecaySegment>& segments,
                                            std::int64_t begin, std::int64_t count);

}  // namespace tandem::production
