// A trainer's main state (SPEC 7, 9): main weights, Adam moments and the counters, in the
// engine's main precision — double or 50 digits for the reference, float for production.
// Checkpoints store exactly this (core/checkpoint/main_state.hpp).
#pragma once

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

}  // namespace tandem
