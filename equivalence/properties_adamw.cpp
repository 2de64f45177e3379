// The equivalence property of one AdamW element update on every IEEE input
// (properties_internal.hpp): NaN, infinities, subnormals and -0 included.
#include "equivalence/properties_internal.hpp"

#include <cmath>

#include "equivalence/float_generator.hpp"

namespace tandem::equivalence {

// ---- AdamW on IEEE inputs ----

void adamw_element_matches_spec7_on_every_ieee_input(const TwinKind& kind) {
  const bool same_arithmetic = kind.precision.unit_roundoff == fp64().unit_roundoff;
  // The twin's own domain: fp64 values for a double twin; fp32 values (widened exactly) for an
  // fp32 one, without the random-exponent normals whose squares overflow fp32 but not double
  // (the reference would then be held to a result fp32 cannot represent).
  FloatClassWeights weights;
  if (!same_arithmetic) weights.normal = 0;
  const auto value = same_arithmetic
                         ? ieee_value<double>(weights)
                         : rc::gen::cast<double>(ieee_value<float>(weights));
  AdamwElementCall call;
  call.before.param = *value;
  call.before.exp_avg = *value;
  call.before.exp_avg_sq = std::abs(*value);  // v >= 0 (or NaN/inf) by its domain
  call.grad = *value;
  call.lr = *rc::gen::element(1.0, 1e-3, 0.5, 0.0);
  call.wd = *rc::gen::element(0.0, 0.1, 0.5);
  call.optimizer.adam_beta1 = *rc::gen::element(0.9, 0.0, 0.5);
  call.optimizer.adam_beta2 = *rc::gen::element(0.95, 0.0, 0.999);
  call.optimizer.adam_eps = *rc::gen::element(1e-8, 1e-3, 0.5);
  call.step = *rc::gen::inRange<std::int64_t>(1, 50);
  const AdamwElement expected = reference_twin().adamw_element(call);
  const AdamwElement observed = kind.adamw_element(call);
  Report report;
  AdamwElementInput in;
  in.param = call.before.param;
  in.exp_avg = call.before.exp_avg;
  in.exp_avg_sq = call.before.exp_avg_sq;
  in.grad = call.grad;
  in.lr = call.lr;
  in.wd = call.wd;
  in.beta1 = call.optimizer.adam_beta1;
  in.beta2 = call.optimizer.adam_beta2;
  in.eps = call.optimizer.adam_eps;
  in.step = call.step;
  const AdamwElementBound bound = adamw_element_bound(in, {kind.precision, fp64()});
  for (const auto& [name, a, b, tolerance] :
       {std::tuple{"param", expected.param, observed.param, bound.param},
        std::tuple{"exp_avg", expected.exp_avg, observed.exp_avg, bound.exp_avg},
        std::tuple{"exp_avg_sq", expected.exp_avg_sq, observed.exp_avg_sq, bound.exp_avg_sq}}) {
    Finding f;
    f.update = 1;
    f.quantity = name;
    f.reference = a;
    f.under_test = b;
    // Same arithmetic, same formula: exact (class, sign of zero, value). Otherwise classes
    // first, then the element bound.
    f.comparison = same_arithmetic ? Comparison::exact : Comparison::approximate;
    if (same_arithmetic) {
      f.ok = same_ieee_value(a, b);
    } else if (!std::isfinite(a) || !std::isfinite(b)) {
      f.ok = classify(a) == classify(b);
    } else {
      f.bound = tolerance;
      f.ok = same_ieee_value(a, b) || std::abs(a - b) <= tolerance;  // equal needs no bound
    }
    f.error = std::isfinite(a) && std::isfinite(b) ? std::abs(a - b) : (f.ok ? 0 : INFINITY);
    report.add(f);
  }
  assert_report(report);
}

}  // namespace tandem::equivalence
