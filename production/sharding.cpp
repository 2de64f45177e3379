// The data-parallel buckets and the ranks' slices (sharding.hpp).
#include "production/sharding.hpp"

#include <stdexcept>
#include <string>

namespace tandem::production {

FlatShards make_flat_shards(std::int64_t total, std::int64_t ranks, std::int64_t alignment,
                            std::int64_t bucket_elements) {
  if (total < 0 || ranks < 1 || alignment < 1 || bucket_elements < 0) {
    throw std::invalid_argument("make_flat_shards: total " + std::to_string(total) + ", ranks " +
                                std::to_string(ranks) + ", alignment " + std::to_string(alignment) +
                                ", bucket elements " + std::to_string(bucket_elements));
  }
  const std::int64_t unit = ranks * alignment;
  const auto round_up = [unit](std::int64_t elements) {
    return std::max<std::int64_t>(1, (elements + unit - 1) / unit) * unit;
  };
  FlatShards shards{total, ranks, {}};
  const std::int64_t bucket = bucket_elements == 0 ? round_up(total) : round_up(bucket_elements);
  std::int64_t begin = 0;
  do {
    const std::int64_t elements = std::min(bucket, round_up(total - begin));
    shards.buckets.push_back(GradientBucket{begin, elements});
    begin += elements;
  } while (begin < total);
  return shards;
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
