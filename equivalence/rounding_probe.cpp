// The rounding probe's draws and scope (equivalence/rounding_probe.hpp).
#include "equivalence/rounding_probe.hpp"

#include <random>
#include <vector>

namespace tandem::equivalence {

namespace rounding_probe_detail {

const float* normal_table() {
  static const std::vector<float> table = [] {
    std::mt19937_64 generator(0x7a6e64656d5eedULL);  // fixed: the same table in every run
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<float> draws(static_cast<std::size_t>(kTableRows) * kRoundingProbes);
    for (float& draw : draws) draw = static_cast<float>(normal(generator));
    return draws;
  }();
  return table.data();
}

const float* sign_patterns() {
  static const std::vector<float> patterns = [] {
    std::vector<float> lanes(256 * 8);
    for (int pattern = 0; pattern < 256; ++pattern) {
      for (int j = 0; j < 8; ++j) {
        lanes[static_cast<std::size_t>(pattern * 8 + j)] = ((pattern >> j) & 1) != 0 ? -1.0F : 1.0F;
      }
    }
    return lanes;
  }();
  return patterns.data();
}

}  // namespace rounding_probe_detail

RoundingProbeScope::RoundingProbeScope(const RoundingModel& model)
    : previous_(rounding_probe_detail::stream) {
  rounding_probe_detail::Stream& s = rounding_probe_detail::stream;
  s.model = model;
  s.table = rounding_probe_detail::normal_table();
  s.signs = rounding_probe_detail::sign_patterns();
  s.active = true;
}

RoundingProbeScope::~RoundingProbeScope() { rounding_probe_detail::stream = previous_; }

RoundingWeightScope::RoundingWeightScope(float relative)
    : arithmetic_(rounding_probe_detail::stream.model.arithmetic_weight),
      function_(rounding_probe_detail::stream.model.function_weight) {
  rounding_probe_detail::stream.model.arithmetic_weight = arithmetic_ * relative;
  rounding_probe_detail::stream.model.function_weight = function_ * relative;
}

RoundingWeightScope::~RoundingWeightScope() {
  rounding_probe_detail::stream.model.arithmetic_weight = arithmetic_;
  rounding_probe_detail::stream.model.function_weight = function_;
}

}  // namespace tandem::equivalence
