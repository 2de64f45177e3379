// The data-parallel partition of the flat parameter buffer (core/model_layout.hpp), Megatron's
// buckets and distributed optimizer: the buffer, padded with zeros, is cut into gradient buckets
// (one bucket without --overlap-grad-reduce); each bucket's length is a multiple of DP x the
// alignment, and rank r owns slice r of every bucket: the main gradients it reduces, and with the
// distributed optimizer the main weights, m and v it keeps. The alignment is the norm's block
// (trainer.hpp kNormBlockElements), so every squared-norm block lies inside one slice and the norm
// sums the same blocks in the same order for every DP size and bucket size (SPEC 6).
//
// Unlike Megatron, a bucket boundary may cut a tensor (the buckets are cut in the checkpoint's
// flat order, so the padding is only at the end); a bucket is ready once every element of it is.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/train/main_state.hpp"
#include "production/arithmetic.hpp"
#include "production/kernels/optimizer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

struct FlatShards {
  std::int64_t total = 0;  // N: parameter elements
  std::int64_t ranks = 1;  // DP
  std::vector<GradientBucket> buckets;  // in flat order, tiling [0, padded()): elements = DP x slice

  // Elements of the exchanged buffers: the flat buffer padded with zeros to the last bucket's end.
  std::int64_t padded() const { return buckets.empty() ? 0 : buckets.back().begin + buckets.back().elements; }
  std::int64_t slice(std::size_t bucket) const { return buckets[bucket].elements / ranks; }
  // Where rank's slice of `bucket` begins in the padded buffer.
  std::int64_t slice_begin(std::size_t bucket, std::int64_t rank) const {
    return buckets[bucket].begin + rank * slice(bucket);
  }
  // Elements of all of one rank's slices, padding included: padded() / ranks.
  std::int64_t rank_elements() const { return padded() / ranks; }
  // The parameters rank owns: its slice of each bucket cut at N, empty ones left out, in flat
  // order.
  std::vector<FlatRange> owned(std::int64_t rank) const;
  // The bucket holding flat element `flat` (< padded()).
  std::size_t bucket_of(std::int64_t flat) const;
  std::int64_t owner(std::int64_t flat) const {
    const std::size_t bucket = bucket_of(flat);
    return (flat - buckets[bucket].begin) / slice(bucket);
  }
};

// The buckets of core/config.hpp's gradient_buckets (bucket_elements = 0: one bucket; the first
// `leading` elements in buckets of their own).
FlatShards make_flat_shards(std::int64_t total, std::int64_t ranks, std::int64_t alignment,
                            std::int64_t bucket_elements = 0, std::int64_t leading = 0);

// The decay segments (trainer.hpp decay_segments) that cover [begin, begin + count), cut at its
// ends and made relative to `begin` (AdamW's range).
std::vector<DecaySegment> segments_in_range(const std::vector<DecaySegment>& segments,
                                            std::int64_t begin, std::int64_t count);

}  // namespace tandem::production
