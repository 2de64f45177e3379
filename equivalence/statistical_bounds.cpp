// Statistical bounds of one update (statistical_bounds.hpp): the reference's forward and backward
// (reference/model_impl.hpp, instantiated here for the rounding probe) over the update's batch,
// sample by sample with SPEC 5's loss scales, then the loss, the norm and each probe's spread.
#include "equivalence/statistical_bounds.hpp"

#include <algorithm>
#include <cmath>

#include "core/model_layout.hpp"
#include "equivalence/error_bounds.hpp"
#include "equivalence/rounding_probe.hpp"
#include "reference/model_impl.hpp"
#include "reference/model_ops_impl.hpp"

namespace tandem::equivalence {
namespace {

// Both sides' roundings are independent: their variance proxies add.
double combined(double under_test, double reference) {
  return std::sqrt(under_test * under_test + reference * reference);
}

}  // namespace

double probe_bound_factor() {
  static const double factor = [] {
    const double k = kRoundingProbes;
    return std::sqrt(k * (std::pow(2.0 / kProbeFailureProbability, 2.0 / k) - 1.0));
  }();
  return factor;
}

double statistical_bounds_bytes(const RunConfig& config) {
  const auto parameters = static_cast<double>(make_model_layout(config.model).total_elements);
  const auto activations = static_cast<double>(reference::workspace_values(config.model, config.model.seq_length));
  return static_cast<double>(sizeof(Probed)) * (2 * parameters + activations) + sizeof(double) * parameters;
}

StatisticalBounds statistical_error_bounds(const RunConfig& config, const std::vector<double>& params,
                                           const std::vector<Sample>& batch,
                                           const PrecisionPair& precisions, std::uint64_t seed) {
  const double unit = combined(precisions.under_test.unit_roundoff, precisions.reference.unit_roundoff);
  const double norm_unit = combined(precisions.under_test.norm_roundoff, precisions.reference.norm_roundoff);
  const ModelLayout layout = make_model_layout(config.model);
  const double factor = probe_bound_factor();
  StatisticalBounds bounds;

  // The forward and backward of every sample, as the reference trainer adds them (SPEC 5); the
  // loss sums (rows, samples, the mean) in the norm arithmetic, as production takes them.
  const auto wide_sums = static_cast<float>(norm_unit / unit);
  RoundingModel model;
  model.constants_round_to_fp32 = std::max(precisions.under_test.unit_roundoff,
                                           precisions.reference.unit_roundoff) >= 0x1p-24;
  model.loss_sum_weight = wide_sums;
  model.seed = seed;
  RoundingProbeScope scope(model);
  std::vector<Probed> probed_params(params.begin(), params.end());  // teacher-forced: exact
  std::vector<Probed> grads(params.size());
  Probed loss_sum = 0;
  std::int64_t loss_tokens = 0;
  const std::vector<double> scales = sample_loss_scales(config, batch);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const reference::LossAndCounts<Probed> part = reference::forward_backward<Probed>(
        config.model, layout, probed_params, {batch[i]}, Probed(scales[i]), grads);
    add_to_loss_sum(loss_sum, part.masked_loss_sum);
    loss_tokens += part.loss_tokens;
  }
  Probed loss;
  if (loss_tokens > 0) {
    const RoundingWeightScope in_double(wide_sums);
    loss = loss_sum / Probed(loss_tokens);
  }

  // The norm: the squares summed and the root in the norm arithmetic, the gradient's own probes
  // carried through them.
  Probed norm;
  {
    const RoundingWeightScope in_double(wide_sums);
    Probed squares = 0;
    for (const Probed& g : grads) squares += g * g;
    norm = sqrt(squares);
  }

  const double underflow = precisions.under_test.underflow + precisions.reference.underflow;
  bounds.finite = true;
  auto bound_of = [&](const Probed& value) {
    const double spread = value.spread();
    if (!std::isfinite(spread)) bounds.finite = false;
    // A value no rounding touched (an exact zero) keeps a zero bound; any other one adds the
    // underflow of a rounding below the normal range, which the relative model leaves out.
    return spread > 0 ? factor * unit * spread + underflow : 0.0;
  };
  bounds.gradient.resize(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) bounds.gradient[i] = bound_of(grads[i]);
  bounds.loss = bound_of(loss);
  bounds.norm = bound_of(norm);
  return bounds;
}

}  // namespace tandem::equivalence
