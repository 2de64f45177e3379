// Per-element bounds on how far two twins' gradients (and losses) of one update may differ:
// the reference's forward and backward replayed with a bound on every activation's error beside
// its value (equivalence/error_ops.hpp, one rule per operation), so each gradient element gets
// the magnitude of the sums that actually produce it (for W = X^T dY: |X|^T |dY| with the errors
// of X and dY carried), instead of tolerance.hpp's worst case max|g| x GBS x gamma_{GBS seq
// max(d, F, V)}. docs/EQUIVALENCE.md derives it.
//
// First order in the unit roundoffs, doubled for the products of roundings it leaves out
// (reference/audit.cpp's margin). Held to by production fp32 and the double reference; bf16
// twins keep tolerance.hpp's worst-case bound (see per_element_bounds_apply).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "equivalence/tolerance.hpp"

namespace tandem::equivalence {

struct GradientErrorBounds {
  std::vector<double> gradient;  // [P] bound on |g_test - g_ref| per element, before clipping
  double loss = 0;               // bound on |loss_test - loss_ref| (the logged token mean)
};

// The bounds of one update from `params` (both twins' shared state, teacher forcing) on the
// global batch `batch` ([GBS] samples in global order, batch[0] the first of the update; the
// microbatch grouping of `config`'s layout gives each sample its SPEC 5 loss scale).
GradientErrorBounds gradient_error_bounds(const RunConfig& config, const std::vector<double>& params,
                                          const std::vector<Sample>& batch,
                                          const PrecisionPair& precisions);

// SPEC 5's loss scale of every sample of `batch` (as gradient_error_bounds), as the reference
// trainer groups them into microbatches and replicas.
std::vector<double> sample_loss_scales(const RunConfig& config, const std::vector<Sample>& batch);

// Whether the per-element bounds hold for this pair: not when either side stores bf16 (a
// first-order bound failed there once, docs/EQUIVALENCE.md "Soak findings"; those twins keep
// the worst-case bound).
bool per_element_bounds_apply(const PrecisionPair& precisions);

}  // namespace tandem::equivalence
