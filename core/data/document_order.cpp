// Document order per epoch: SplitMix64, unbiased bounded integers, Fisher-Yates
// (see document_order.hpp; the stream is specified in docs/DATA.md).
#include "core/data/document_order.hpp"

#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace tandem::data {

namespace {
// Separates the document-order stream from every other stream seeded by --seed ("tandemDO").
constexpr std::uint64_t kDocumentOrderTag = 0x74616E64656D444FULL;
}  // namespace

std::uint64_t document_order_state(std::uint64_t seed, std::uint64_t epoch) {
  return splitmix64_mix(splitmix64_mix(seed ^ kDocumentOrderTag) + epoch);
}

void fisher_yates_shuffle(std::vector<std::int64_t>& items, SplitMix64& stream) {
  for (std::size_t i = items.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(stream.below(i));
    std::swap(items[i - 1], items[j]);
  }
}

std::vector<std::int64_t> epoch_order(std::int64_t count, bool shuffled, std::uint64_t seed,
                                      std::uint64_t epoch) {
  if (count < 0) throw std::invalid_argument("epoch_order: count " + std::to_string(count) + " < 0");
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (shuffled) {
    SplitMix64 stream(document_order_state(seed, epoch));
    fisher_yates_shuffle(order, stream);
  }
  return order;
}

}  // namespace tandem::data
