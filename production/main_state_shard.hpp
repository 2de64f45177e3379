// This rank's pieces of the production trainer's fp32 main state (SPEC 7, 9): main weights, Adam
// m and v for the flat ranges the rank keeps (its slices of the gradient buckets with the
// distributed optimizer, else the whole buffer), stored one piece after another in three backend
// buffers. The trainer updates them (AdamW, production/trainer.cpp); checkpoints read and restore
// them (production/checkpointing.hpp); the audit reads single elements (update_audit.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/train/main_state.hpp"
#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/kernels/optimizer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

class MainStateShard {
 public:
  struct Piece {
    std::int64_t begin = 0;  // flat
    std::int64_t count = 0;
    std::int64_t local = 0;  // offset in weights(), exp_avg(), exp_avg_sq()
    std::vector<DecaySegment> segments;  // AdamW's, relative to begin
  };

  MainStateShard() = default;
  // The pieces `kept` (in increasing flat order; empty ones left out) with their decay segments
  // cut from `segments` (over the whole flat buffer), weights from `initial` [N], moments 0.
  MainStateShard(Backend& backend, std::span<const FlatRange> kept, const std::vector<DecaySegment>& segments,
                 std::span<const Real> initial);

  const std::vector<Piece>& pieces() const { return pieces_; }
  std::int64_t elements() const { return elements_; }  // of all pieces
  std::vector<FlatRange> ranges() const;
  // The offset of flat element `flat` in the state buffers, or -1 when this rank does not keep it.
  std::int64_t local_offset(std::int64_t flat) const;

  Buffer<Real>& weights() { return weights_; }        // [elements] fp32 main weights
  const Buffer<Real>& weights() const { return weights_; }
  Buffer<Real>& exp_avg() { return exp_avg_; }        // [elements] fp32 m
  const Buffer<Real>& exp_avg() const { return exp_avg_; }
  Buffer<Real>& exp_avg_sq() { return exp_avg_sq_; }  // [elements] fp32 v
  const Buffer<Real>& exp_avg_sq() const { return exp_avg_sq_; }

  // The state of `range` (inside one piece), downloaded.
  MainStateSlice<Real> slice(const FlatRange& range) const;
  // Uploads `slices`, one per piece and equal to it in range; throws std::invalid_argument naming
  // both ranges otherwise (nothing is uploaded then).
  void upload(std::span<const MainStateSlice<Real>> slices);

 private:
  Backend* backend_ = nullptr;
  std::vector<Piece> pieces_;
  std::int64_t elements_ = 0;
  Buffer<Real> weights_;
  Buffer<Real> exp_avg_;
  Buffer<Real> exp_avg_sq_;
};

}  // namespace tandem::production
