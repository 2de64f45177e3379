// A trainer's main state (SPEC 7, 9): main weights, Adam moments and the counters, in the
// engine's main precision — double or 50 digits for the reference, float for production.
// Checkpoints store exactly this (core/checkpoint/main_state.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/train/records.hpp"

namespace tandem {

template <class Scalar>
struct MainState {
  std::vector<Scalar> params;      // [layout.total_elements] main weights
  std::vector<Scalar> exp_avg;     // [layout.total_elements] Adam m
  std::vector<Scalar> exp_avg_sq;  // [layout.total_elements] Adam v
  Counters counters;
};

// Elements [begin, begin + count) of the flat parameter buffer.
struct FlatRange {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  bool operator==(const FlatRange&) const = default;
};

// Elements [begin, begin + params.size()) of the flat main state, without the counters: one piece
// of what a data-parallel rank writes to, or reads from, a sharded checkpoint
// (core/checkpoint/sharded.hpp).
template <class Scalar>
struct MainStateSlice {
  std::int64_t begin = 0;
  std::vector<Scalar> params;
  std::vector<Scalar> exp_avg;
  std::vector<Scalar> exp_avg_sq;
};

}  // namespace tandem
