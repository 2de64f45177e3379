// The tensor-parallel exchanges (tensor_parallel_comm.hpp).
#include "production/tensor_parallel_comm.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

TensorParallelComm::TensorParallelComm(Backend& backend, std::shared_ptr<Collectives> group,
                                       std::int64_t max_elements)
    : backend_(&backend), group_(std::move(group)) {
  const std::int64_t ranks = group_->size();
  if (ranks <= 1) return;
  part_capacity_ = (max_elements + ranks - 1) / ranks;
  received_ = Buffer<Real>(backend, (ranks - 1) * part_capacity_);
  padded_ = Buffer<Real>(backend, ranks * part_capacity_);
  part_sum_ = Buffer<Real>(backend, part_capacity_);
}

// In step k = 1 .. TP-1 rank r sends its contribution to rank (r + k)'s part to it and receives
// rank (r - k)'s contribution to its own part into row k-1; then the parts are added in rank order.
void TensorParallelComm::reduce_scatter(const Real* partial, Real* shard, std::int64_t count) {
  const int ranks = size();
  const int me = rank();
  if (count % ranks != 0) {
    throw std::logic_error("TensorParallelComm::reduce_scatter: " + std::to_string(count) +
                           " elements over " + std::to_string(ranks) + " ranks");
  }
  const std::int64_t part = count / ranks;
  const auto bytes = part * static_cast<std::int64_t>(sizeof(Real));
  if (ranks == 1) {
    if (shard != partial) backend_->copy(shard, partial, bytes);
    return;
  }
  if (part > part_capacity_) {
    throw std::logic_error("TensorParallelComm::reduce_scatter: a part of " + std::to_string(part) +
                           " elements, capacity " + std::to_string(part_capacity_));
  }
  for (int step = 1; step < ranks; ++step) {
    const int to = (me + step) % ranks;
    const int from = (me - step + ranks) % ranks;
    group_->send_receive(partial + to * part, to, received_.at((step - 1) * part), from, part);
  }
  // Rank q's contribution: this rank's own, or the row it arrived in (step (me - q) mod TP).
  const auto contribution = [&](int q) -> const Real* {
    return q == me ? partial + me * part : received_.at(((me - q + ranks) % ranks - 1) * part);
  };
  backend_->copy(shard, contribution(0), bytes);
  for (int q = 1; q < ranks; ++q) backend_->add(AddParams{shard, contribution(q), shard, part, DType::f32});
}

void TensorParallelComm::all_reduce(Real* values, std::int64_t count) {
  const int ranks = size();
  if (ranks == 1 || count == 0) return;
  // In chunks of the buffers' capacity: each element's sum is the same rank-order sum whatever
  // the chunk it falls in.
  const std::int64_t capacity = part_capacity_ * ranks;
  for (std::int64_t begin = 0; begin < count; begin += capacity) {
    all_reduce_chunk(values + begin, std::min(capacity, count - begin));
  }
}

void TensorParallelComm::all_reduce_chunk(Real* values, std::int64_t count) {
  const int ranks = size();
  const std::int64_t part = (count + ranks - 1) / ranks;
  const auto element = static_cast<std::int64_t>(sizeof(Real));
  padded_.zero();
  backend_->copy(padded_.data(), values, count * element);
  reduce_scatter(padded_.data(), part_sum_.data(), part * ranks);
  backend_->copy(padded_.at(rank() * part), part_sum_.data(), part * element);
  group_->all_gather_in_place(padded_.data(), part * element);
  backend_->copy(values, padded_.data(), count * element);
}

void TensorParallelComm::all_gather(const void* part, void* full, std::int64_t part_bytes) {
  auto* mine = static_cast<std::uint8_t*>(full) + rank() * part_bytes;
  if (mine != part) backend_->copy(mine, part, part_bytes);
  if (size() > 1) group_->all_gather_in_place(full, part_bytes);
}

}  // namespace tandem::production
