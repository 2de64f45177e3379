// The data-parallel buckets and the ranks' slices (sharding.hpp).
#include "production/sharding.hpp"

#include <stdexcept>
#include <string>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

FlatShards make_flat_shards(std::int64_t total, std::int64_t ranks, std::int64_t alignment,
                            std::int64_t bucket_elements, std::int64_t leading) {
  return FlatShards{total, ranks, gradient_buckets(total, ranks, alignment, bucket_elements, leading)};
}

std::vector<FlatRange> FlatShards::owned(std::int64_t rank) const {
  std::vector<FlatRange> ranges;
  for (std::size_t bucket = 0; bucket < buckets.size(); ++bucket) {
    const std::int64_t begin = std::min(slice_begin(bucket, rank), total);
    const std::int64_t end = std::min(slice_begin(bucket, rank) + slice(bucket), total);
    if (begin < end) ranges.push_back(FlatRange{begin, end - begin});
  }
  return ranges;
}

std::size_t FlatShards::bucket_of(std::int64_t flat) const {
  const auto after = std::upper_bound(buckets.begin(), buckets.end(), flat,
                                      [](std::int64_t value, const GradientBucket& bucket) { return value < bucket.begin; });
  if (flat < 0 || after == buckets.begin() || flat >= padded()) {
    throw std::out_of_range("FlatShards::bucket_of: element " + std::to_string(flat) + " outside [0, " +
                            std::to_string(padded()) + ")");
  }
  return static_cast<std::size_t>(after - buckets.begin() - 1);
}

std::vector<DecaySegment> segments_in_range(const std::vector<DecaySegment>& segments,
                                            std::int64_t begin, std::int64_t count) {
  std::vector<DecaySegment> out;
  const std::int64_t end = begin + count;
  for (const DecaySegment& segment : segments) {
    const std::int64_t first = std::max(segment.begin, begin);
    const std::int64_t last = std::min(segment.begin + segment.count, end);
    if (first < last) out.push_back(DecaySegment{first - begin, last - first, segment.decay});
  }
  return out;
}

}  // namespace tandem::production
