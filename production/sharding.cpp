// The distributed optimizer's partition (sharding.hpp).
#include "production/sharding.hpp"

#include <stdexcept>
#include <string>

namespace tandem::production {

FlatShards make_flat_shards(std::int64_t total, std::int64_t ranks, std::int64_t alignment) {
  if (total < 0 || ranks < 1 || alignment < 1) {
    throw std::invalid_argument("make_flat_shards: total " + std::to_string(total) + ", ranks " +
                                std::to_string(ranks) + ", alignment " + std::to_string(alignment));
  }
  const std::int64_t per_rank = (total + ranks - 1) / ranks;
  const std::int64_t aligned = std::max<std::int64_t>(1, (per_rank + alignment - 1) / alignment);
  return FlatShards{total, ranks, aligned * alignment};
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
