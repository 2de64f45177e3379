// This rank's pieces of the main state (main_state_shard.hpp).
#include "production/main_state_shard.hpp"

#include <stdexcept>
#include <string>

#include "production/sharding.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

std::string describe(std::int64_t begin, std::int64_t count) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

}  // namespace

MainStateShard::MainStateShard(Backend& backend, std::span<const FlatRange> kept,
                               const std::vector<DecaySegment>& segments, std::span<const Real> initial)
    : backend_(&backend) {
  for (const FlatRange& range : kept) {
    if (range.count == 0) continue;
    pieces_.push_back(Piece{range.begin, range.count, elements_, segments_in_range(segments, range.begin, range.count)});
    elements_ += range.count;
  }
  weights_ = Buffer<Real>(backend, elements_);
  exp_avg_ = Buffer<Real>(backend, elements_);
  exp_avg_sq_ = Buffer<Real>(backend, elements_);
  for (const Piece& piece : pieces_) {
    backend.copy_from_host(weights_.at(piece.local), initial.data() + piece.begin,
                           piece.count * static_cast<std::int64_t>(sizeof(Real)));
  }
}

std::vector<FlatRange> MainStateShard::ranges() const {
  std::vector<FlatRange> out;
  for (const Piece& piece : pieces_) out.push_back(FlatRange{piece.begin, piece.count});
  return out;
}

std::int64_t MainStateShard::local_offset(std::int64_t flat) const {
  for (const Piece& piece : pieces_) {
    if (flat >= piece.begin && flat < piece.begin + piece.count) return piece.local + (flat - piece.begin);
  }
  return -1;
}

MainStateSlice<Real> MainStateShard::slice(const FlatRange& range) const {
  const std::int64_t local = local_offset(range.begin);
  if (range.count > 0 && (local < 0 || local_offset(range.begin + range.count - 1) != local + range.count - 1)) {
    throw std::invalid_argument("MainStateShard::slice: " + describe(range.begin, range.count) +
                                " is not inside one piece this rank keeps");
  }
  return MainStateSlice<Real>{range.begin, weights_.download(local, range.count), exp_avg_.download(local, range.count),
                               exp_avg_sq_.download(local, range.count)};
}

void MainStateShard::upload(std::span<const MainStateSlice<Real>> slices) {
  if (slices.size() != pieces_.size()) {
    throw std::invalid_argument("Trainer::restore: " + std::to_string(slices.size()) + " pieces for the " +
                                std::to_string(pieces_.size()) + " ranges this rank keeps");
  }
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const MainStateSlice<Real>& slice = slices[i];
    const Piece& mine = pieces_[i];
    const auto size = static_cast<std::int64_t>(slice.params.size());
    if (slice.begin != mine.begin || size != mine.count || static_cast<std::int64_t>(slice.exp_avg.size()) != size ||
        static_cast<std::int64_t>(slice.exp_avg_sq.size()) != size) {
      throw std::invalid_argument("Trainer::restore: the piece " + describe(slice.begin, size) +
                                  " is not this rank's range " + describe(mine.begin, mine.count));
    }
  }
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const Piece& mine = pieces_[i];
    const auto bytes = mine.count * static_cast<std::int64_t>(sizeof(Real));
    backend_->copy_from_host(weights_.at(mine.local), slices[i].params.data(), bytes);
    backend_->copy_from_host(exp_avg_.at(mine.local), slices[i].exp_avg.data(), bytes);
    backend_->copy_from_host(exp_avg_sq_.at(mine.local), slices[i].exp_avg_sq.data(), bytes);
  }
}

}  // namespace tandem::production
