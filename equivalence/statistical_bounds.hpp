// Statistical bounds on how far two twins' gradients, loss and norm of one update may differ:
// the reference's own forward and backward run on the rounding probe (equivalence/rounding_probe.hpp),
// whose kRoundingProbes linearized runs with random rounding errors estimate each value's rounding
// spread sigma = u ||c||; the bound is kProbeBoundFactor x that estimate.
//
// The model (Higham and Mary, "A New Approach to Probabilistic Rounding Error Analysis", 2019):
// each rounding's relative error delta_j is bounded by u and mean-independent of the ones before
// it, so the first-order error sum_j c_j delta_j is sub-Gaussian with variance proxy u^2 ||c||^2
// (Azuma-Hoeffding). The probes' mean square is an independent estimate u^2 ||c||^2 chi2_K / K, so
//   P(|error| > b x estimate) <= E[2 exp(-b^2 chi2_K / (2K))] = 2 (1 + b^2/K)^(-K/2),
// and b = kProbeBoundFactor makes that kProbeFailureProbability per value. The c_j are the
// reference's: a twin that sums in blocks or fuses multiply-adds rounds fewer or smaller partial
// sums; docs/EQUIVALENCE.md "Statistical bounds" states what the model covers and what it assumes.
//
// Not a worst-case bound: comparison.cpp's update_bounds takes the smaller of it and the rigorous
// ones (tolerance.hpp, error_bounds.hpp), for the pairs per_element_bounds_apply admits (no bf16),
// unless PrecisionPair::rigorous_only.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "equivalence/tolerance.hpp"

namespace tandem::equivalence {

// Per value, the probability that a correct twin's error exceeds its statistical bound (under
// the model above): 1e-12, so a soak of 1e8 compared values fails falsely with probability 1e-4.
inline constexpr double kProbeFailureProbability = 1e-12;
// b with 2 (1 + b^2/K)^(-K/2) = kProbeFailureProbability, K = kRoundingProbes (12.49 for 32).
double probe_bound_factor();

struct StatisticalBounds {
  std::vector<double> gradient;  // [P] bound on |g_test - g_ref| per element, before clipping
  double loss = 0;               // the logged token mean
  double norm = 0;               // the global norm before clipping (SPEC 6)
  bool finite = false;           // false when a probe overflowed: the bounds say nothing then
};

// The bounds of one update from `params` (both twins' state, teacher forcing) on the global
// batch `batch` (as error_bounds.hpp's gradient_error_bounds), the probes' draws seeded by `seed`.
StatisticalBounds statistical_error_bounds(const RunConfig& config, const std::vector<double>& params,
                                           const std::vector<Sample>& batch,
                                           const PrecisionPair& precisions, std::uint64_t seed);

// The memory statistical_error_bounds takes for `config` (the probed parameters and gradient, one
// sample's probed activations and scratch, the bounds): 160 bytes a value, for refusing a model
// too large for it before it allocates (tandem check).
double statistical_bounds_bytes(const RunConfig& config);

}  // namespace tandem::equivalence
