// The equivalence properties over one twin's updates (properties_internal.hpp): update by update
// against the reference, accumulated microbatches against the direct global batch, and the clip
// decision at its threshold.
#include "equivalence/properties_internal.hpp"

#include <cmath>
#include <sstream>

#include "equivalence/float_generator.hpp"

namespace tandem::equivalence {

// ---- the update property ----

namespace {

void updates_match(const TwinKind& kind, bool compare_consumed_samples) {
  CaseLimits limits;
  limits.max_updates = 3;
  limits.injections = true;
  UpdateCase c = *update_case(limits);
  adapt_to(kind, c);
  const PrecisionPair precisions = harness_pair(precision_of(kind, c.config), fp64());
  RunConfig reference_config = with_layout(c.config, c.reference_layout);
  const auto samples = shipped_samples(reference_config, c.documents);
  reference_config.optimizer.clip_grad = clip_for(c, reference_config, samples, precisions);
  RunConfig test_config = with_layout(reference_config, c.test_layout);

  auto reference = reference_twin().make(setup_for(reference_config, samples, c.injection, starting_samples(c)));
  auto under_test = kind.make(setup_for(test_config, samples, c.injection, starting_samples(c)));
  Report report;
  // SPEC 4: iteration 0 is bit-identical in every engine (fp32 draws widened exactly).
  compare_states_bitwise(0, "initial ", reference->state(), under_test->state(), report);
  move_to_position(*under_test, starting_samples(c), reference_config.batch.global_batch_size);
  run_teacher_forced(*reference, *under_test, c.updates, reference_config, precisions, report, {},
                     compare_consumed_samples);
  assert_report(report, &precisions);
}

}  // namespace

void updates_match_the_reference(const TwinKind& kind) { updates_match(kind, true); }

// The data-side mutants are caught by the sample comparison at once; this variant shows that the
// training outputs alone catch them too (what a twin that rebuilds positions and spans on the
// device, where the harness cannot read them, relies on).
void training_outputs_match_the_reference(const TwinKind& kind) { updates_match(kind, false); }

// ---- split invariance ----

void accumulated_microbatches_equal_the_direct_global_batch(const TwinKind& kind) {
  UpdateCase c = *update_case(CaseLimits{1, false, false});
  adapt_to(kind, c);
  // The property is SPEC 5's per-token claim; clipping is held elsewhere (pre-clip gradients).
  c.config.data.loss_normalization = LossNormalization::per_token;
  c.config.optimizer.clip_grad = 0.0;
  const std::int64_t gbs = c.test_layout.global_batch_size();
  const std::vector<BatchLayout> layouts = all_layouts(gbs);
  const RunConfig direct_config = with_layout(c.config, layouts.front());
  const auto samples = shipped_samples(direct_config, c.documents);
  const PrecisionPair precisions = harness_pair(precision_of(kind, c.config), precision_of(kind, c.config));

  auto direct = kind.make(setup_for(direct_config, samples, {}, 0));
  move_to_position(*direct, starting_samples(c), gbs);
  UpdateObservation observed;  // the direct batch's update: what the bounds are built from
  observed.before = direct->state();
  observed.batch = update_batch(*direct, observed.before, direct_config);
  observed.record = direct->run_iteration();
  observed.gradient = direct->last_gradient();
  const IterationRecord& direct_record = observed.record;
  const std::vector<double>& direct_gradient = observed.gradient;
  const UpdateBounds bounds = update_bounds(direct_config, precisions, observed, 1.0);  // no clipping
  const double norm_error = bounds.norm;
  const double loss_error = bounds.loss;

  Report report;
  std::int64_t index = 0;
  for (const BatchLayout& layout : layouts) {
    ++index;
    if (index == 1) continue;  // the direct batch itself
    if (kind.max_data_parallel > 0 && layout.data_parallel > kind.max_data_parallel) continue;
    if (kind.required_data_parallel > 0 && layout.data_parallel != kind.required_data_parallel) continue;
    if (kind.required_world_size > 0 &&
        layout.data_parallel * layout.tensor_parallel * layout.pipeline_parallel != kind.required_world_size) {
      continue;
    }
    auto split = kind.make(setup_for(with_layout(c.config, layout), samples, {}, 0));
    move_to_position(*split, starting_samples(c), gbs);
    const IterationRecord record = split->run_iteration();
    const std::vector<double> gradient = split->last_gradient();
    const std::string name = "split mbs " + std::to_string(layout.micro_batch_size) + " x " +
                             std::to_string(layout.microbatches) + " microbatches x DP " +
                             std::to_string(layout.data_parallel);
    report.note("compared: " + name);
    Finding f;
    // Exact: the same bits. Approximate: within the bound (a 0 bound: an element both twins
    // compute as an exact 0, equal as values).
    auto add = [&](const std::string& quantity, const std::string& where, double a, double b,
                   Comparison comparison, double bound) {
      f.update = index;
      f.quantity = quantity;
      f.where = where;
      f.reference = a;
      f.under_test = b;
      f.comparison = comparison;
      f.bound = bound;
      if (!std::isfinite(a) || !std::isfinite(b)) {
        f.ok = classify(a) == classify(b);
        f.error = f.ok ? 0 : INFINITY;
      } else {
        f.error = std::abs(a - b);
        f.ok = comparison == Comparison::exact ? same_ieee_value(a, b) : f.error <= bound;
      }
      report.add(f);
    };
    add(name + ": lr", "", direct_record.lr, record.lr, Comparison::exact, 0);
    add(name + ": loss_tokens", "", static_cast<double>(direct_record.loss_tokens),
        static_cast<double>(record.loss_tokens), Comparison::exact, 0);
    add(name + ": loss", "", direct_record.loss, record.loss, Comparison::approximate, loss_error);
    add(name + ": grad_norm", "", direct_record.grad_norm, record.grad_norm, Comparison::approximate,
        norm_error);
    for (std::size_t i = 0; i < gradient.size(); ++i) {
      add(name + ": gradient", "[" + std::to_string(i) + "]", direct_gradient[i], gradient[i],
          Comparison::approximate, bounds.gradient[i]);
    }
  }
  assert_report(report);
}

// ---- the clip decision at its threshold ----

// SPEC 6 at its boundary, in the twin's own arithmetic: its first update with the threshold placed
// 1e-7 relative below or above its own norm + 1e-6 (probed by the same twin from the same state
// with clipping off: the norm does not depend on clip_grad, and a twin is deterministic). Exact:
// the norm is the probe's bit for bit, clipped iff clip < norm + 1e-6, and clip_coeff = clip /
// (norm + 1e-6) in double when clipped, else 1. (Against the reference such a case is
// undecidable for fp32 and bf16 twins, whose norm bounds are 4e-3 to 0.25 relative: see clip_for.)
// A threshold without the 1e-6 (clip < norm) decides the lower case wrongly whenever
// 1e-7 (norm + 1e-6) < 1e-6, i.e. norm < 10.
void the_clip_decision_holds_within_1e7_of_its_threshold(const TwinKind& kind) {
  UpdateCase c = *update_case(CaseLimits{1, false, false});
  adapt_to(kind, c);
  const bool below = *rc::gen::arbitrary<bool>();
  RunConfig config = with_layout(c.config, c.test_layout);
  // One untied case in four has a norm near 1e-6, where SPEC 6's epsilon is as large as the norm
  // itself (a dropped epsilon shows only there): the final norm's weight and the output layer scaled by 1e-6, so
  // that the whole gradient shrinks with them (every path to the loss crosses both).
  const double shrink =
      config.model.tie_embeddings ? 1.0 : *rc::gen::weightedElement<double>({{3, 1.0}, {1, 1e-6}});
  config.optimizer.clip_grad = 0.0;
  const auto samples = shipped_samples(config, c.documents);
  const std::int64_t start = starting_samples(c);
  const auto first_update = [&] {
    auto twin = kind.make(setup_for(config, samples, {}, start));
    move_to_position(*twin, start, config.batch.global_batch_size);
    if (shrink != 1.0) twin->load_state(with_the_top_of_the_model_scaled(twin->state(), config.model, shrink));
    return twin->run_iteration();
  };
  const IterationRecord probed = first_update();
  const double norm = probed.grad_norm;
  if (!(norm > 0) || !std::isfinite(norm)) return;  // no norm to place a threshold against
  const double relative = below ? -1e-7 : 1e-7;
  config.optimizer.clip_grad = (norm + kClipNormEpsilon) * (1 + relative);
  const IterationRecord record = first_update();
  const bool clipped = config.optimizer.clip_grad < norm + kClipNormEpsilon;
  const double coefficient = clipped ? config.optimizer.clip_grad / (norm + kClipNormEpsilon) : 1.0;
  Report report;
  std::ostringstream note;
  note << "clip " << config.optimizer.clip_grad << " = (norm + 1e-6) x (1 " << (below ? "- " : "+ ")
       << "1e-7), norm " << norm << (shrink != 1.0 ? " (the top of the model scaled by 1e-6)" : "");
  report.note(note.str());
  for (const auto& [name, a, b] : {std::tuple{"grad_norm (the probe's)", norm, record.grad_norm},
                                   std::tuple{"clipped", clipped ? 1.0 : 0.0, record.clipped ? 1.0 : 0.0},
                                   std::tuple{"clip_coeff", coefficient, record.clip_coeff}}) {
    Finding f;
    f.update = 1;
    f.quantity = name;
    f.comparison = Comparison::exact;
    f.reference = a;
    f.under_test = b;
    f.ok = same_ieee_value(a, b);
    f.error = f.ok ? 0 : (std::isfinite(a) && std::isfinite(b) ? std::abs(a - b) : INFINITY);
    report.add(f);
  }
  assert_report(report);
}

}  // namespace tandem::equivalence
