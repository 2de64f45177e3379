// The exchanges of tensor parallelism inside a layer (Megatron's f and g operators and their
// sequence-parallel forms), over the TP ranks of one replica. The project's rule holds: the
// collectives only move bytes, and every sum over TP ranks is added in rank order,
// ((x_0 + x_1) + x_2) + ..., by the backend's fp32 add, so every rank holds the same bits and a
// run gives the same bits on every transport.
//
// Sums run in fp32 (the row-parallel GEMMs and the column-parallel input gradients write fp32
// partials, converted to the compute type once the sum is complete): a bf16 run rounds each
// activation once, where TP = 1 rounds it, and the split only regroups the fp32 reduction
// (docs/PRODUCTION.md "Tensor parallelism"). Megatron reduces the bf16 partials instead.
#pragma once

#include <cstdint>
#include <memory>

#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

class TensorParallelComm {
 public:
  TensorParallelComm() = default;
  // Exchanges of at most `max_elements` fp32 elements over `group` (the TP ranks).
  TensorParallelComm(Backend& backend, std::shared_ptr<Collectives> group, std::int64_t max_elements);

  int size() const { return group_ ? group_->size() : 1; }
  int rank() const { return group_ ? group_->rank() : 0; }
  Collectives& group() const { return *group_; }

  // shard [count / TP] := rank `rank()`'s part of the sum over ranks of `partial` [count], the
  // parts being consecutive (count divisible by TP). `partial` is read only.
  void reduce_scatter(const Real* partial, Real* shard, std::int64_t count);
  // values [count] := the sum over ranks of every rank's `values`, in place, identical on every
  // rank (a reduce-scatter of padded parts, then an all-gather; any count, in chunks of the
  // buffers' capacity).
  void all_reduce(Real* values, std::int64_t count);
  // full [TP x part_bytes] := every rank's `part` (part_bytes bytes each) in rank order.
  void all_gather(const void* part, void* full, std::int64_t part_bytes);

 private:
  void all_reduce_chunk(Real* values, std::int64_t count);  // count <= TP x part capacity

  Backend* backend_ = nullptr;
  std::shared_ptr<Collectives> group_;
  Buffer<Real> received_;  // [(TP-1) x part] the other ranks' contributions to this rank's part
  Buffer<Real> padded_;    // [TP x part] all_reduce's padded copy
  Buffer<Real> part_sum_;  // [part] all_reduce's sum of this rank's part
  std::int64_t part_capacity_ = 0;
};

}  // namespace tandem::production
