// The per-element error bounds (equivalence/error_bounds.hpp, error_ops.hpp): each rule covers an
// exactly known rounding error and is within a small factor of it; a whole update of production
// fp32 (and of the double reference against float50) stays inside them; and a gradient perturbed
// by far less than the worst-case bound of tolerance.hpp (which accepts it) is rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/model_layout.hpp"
#include "equivalence/comparison.hpp"
#include "equivalence/error_bounds.hpp"
#include "equivalence/error_ops.hpp"
#include "equivalence/generators.hpp"
#include "equivalence/statistical_bounds.hpp"
#include "equivalence/twin.hpp"
#include "tests/support/tiny_reference_model.hpp"

namespace tandem::equivalence {
namespace {

TEST(ErrorOps, ALinearBoundCoversTheFp32ErrorOfASumThatLosesEverySmallTerm) {
  // x = [1, 2^-25 x 63] . w = [1 x 64]: fp32 adds 1 first, and 1 + 2^-25 rounds back to 1 (half
  // an ulp of 1 is 2^-24), so fp32 returns exactly 1 and errs by 63 x 2^-25. The double
  // reference is exact here.
  constexpr std::int64_t kTerms = 64;
  std::vector<double> input(kTerms, std::ldexp(1.0, -25));  // [1, 64]
  input[0] = 1.0;
  const std::vector<double> weight(kTerms, 1.0);             // [1, 64]
  const std::vector<double> input_error(kTerms, 0.0);        // [1, 64] exact inputs
  float fp32_sum = 0.0f;
  for (const double x : input) fp32_sum += static_cast<float>(x);
  const double exact = 1.0 + 63 * std::ldexp(1.0, -25);
  const double fp32_error = exact - static_cast<double>(fp32_sum);
  ASSERT_EQ(fp32_error, 63 * std::ldexp(1.0, -25));

  const error_ops::Rounding rounding = error_ops::rounding_of({fp32(), fp64()});
  double bound = 0;  // [1, 1]
  error_ops::linear_forward_error(input.data(), input_error.data(), weight.data(), nullptr, &exact,
                                  1, kTerms, 1, rounding, true, &bound);
  EXPECT_GE(bound, fp32_error);
  // gamma_66 x 1 + u x 1 ~ 67 x 2^-24 = 134 x 2^-25: within 4x of the true error.
  EXPECT_LE(bound, 4 * fp32_error);
}

TEST(ErrorOps, AnRmsnormOfExactInputsIsBoundedByItsOwnRoundingOnly) {
  // x = [3, 4] (mean square 12.5), w = [1, 1], eps 0: r = 1/sqrt(12.5); each y rounds a few
  // times: the bound is a few u relative, nothing carried.
  const std::vector<double> input{3.0, 4.0};   // [1, 2]
  const std::vector<double> weight{1.0, 1.0};  // [2]
  const std::vector<double> zero(2, 0.0);      // [1, 2]
  const double r = 1.0 / std::sqrt(12.5);
  const std::vector<double> output{3.0 * r, 4.0 * r};  // [1, 2]
  const error_ops::Rounding rounding = error_ops::rounding_of({fp32(), fp64()});
  double r_error = 0;
  std::vector<double> output_error(2, 0.0);  // [1, 2]
  error_ops::rmsnorm_forward_error(input.data(), zero.data(), weight.data(), &r, output.data(), 1, 2,
                                   rounding, &r_error, output_error.data());
  const float fp32_r = 1.0f / std::sqrt((3.0f * 3.0f + 4.0f * 4.0f) / 2.0f);
  EXPECT_GE(r_error, std::abs(static_cast<double>(fp32_r) - r));
  EXPECT_LE(r_error, 32 * rounding.unit * r);
  for (std::size_t j = 0; j < 2; ++j) {
    const float y = static_cast<float>(input[j]) * fp32_r;
    EXPECT_GE(output_error[j], std::abs(static_cast<double>(y) - output[j]));
    EXPECT_LE(output_error[j], 64 * rounding.unit * output[j]);
  }
}

// One update of `under_test` against `truth` from the same state on a small fixed case.
struct OneUpdate {
  RunConfig config;
  UpdateObservation reference;
  UpdateObservation under_test;
};

// The documents of the fixed case: lengths around the sequence length, so samples hold several
// documents and some span two.
DocumentLayout fixed_documents() {
  DocumentLayout documents;
  documents.lengths = {5, 40, 17, 9, 3, 60, 1, 25, 30, 12};
  return documents;
}

OneUpdate one_update(const TwinKind& truth, const TwinKind& fast, std::uint64_t seed = 1234,
                     const DocumentLayout& documents = fixed_documents()) {
  OneUpdate run;
  RunConfig& config = run.config;
  config.model = testing::tiny_reference_model();
  config.batch.micro_batch_size = 2;
  config.batch.global_batch_size = 4;
  config.schedule.train_samples = 4;
  config.schedule.lr_decay_samples = 4;
  config.optimizer.clip_grad = 0.0;
  config.data.seed = seed;
  TwinSetup setup;
  setup.config = config;
  setup.samples = shipped_samples(config, documents);
  auto truth_twin = truth.make(setup);
  auto fast_twin = fast.make(setup);
  run.under_test.before = fast_twin->state();
  truth_twin->load_state(run.under_test.before);
  run.reference.before = truth_twin->state();
  run.reference.record = truth_twin->run_iteration();
  run.reference.after = truth_twin->state();
  run.reference.gradient = truth_twin->last_gradient();
  run.reference.batch = update_batch(*truth_twin, run.reference.before, config);
  run.under_test.record = fast_twin->run_iteration();
  run.under_test.after = fast_twin->state();
  run.under_test.gradient = fast_twin->last_gradient();
  return run;
}

Report compare(const OneUpdate& run, const PrecisionPair& precisions, bool per_element) {
  UpdateObservation reference = run.reference;
  if (!per_element) reference.batch.clear();  // tolerance.hpp's worst case
  Report report;
  compare_update(1, run.config, make_model_layout(run.config.model), precisions, reference,
                 run.under_test, report);
  return report;
}

// The gradient element whose per-element bound is smallest relative to its value (the place a
// sharper bound shows first), multiplied by (1 + relative).
struct Perturbation {
  OneUpdate run;
  double per_element_bound = 0;  // of the perturbed element
  double worst_case_bound = 0;   // tolerance.hpp's, the same for every element
  double change = 0;             // |perturbed - reference|
};

Perturbation perturbed(OneUpdate run, const PrecisionPair& precisions, double relative) {
  const GradientErrorBounds bounds =
      gradient_error_bounds(run.config, run.reference.before.params, run.reference.batch, precisions);
  std::size_t sharpest = 0;
  double best = 0;
  double max_abs = 0;
  for (std::size_t i = 0; i < bounds.gradient.size(); ++i) {
    const double g = std::abs(run.reference.gradient[i]);
    max_abs = std::max(max_abs, g);
    if (bounds.gradient[i] > 0 && g / bounds.gradient[i] > best) {
      best = g / bounds.gradient[i];
      sharpest = i;
    }
  }
  Perturbation p;
  p.per_element_bound = bounds.gradient[sharpest];
  p.worst_case_bound = gradient_bound(reduction_shape(run.config), precisions, max_abs);
  p.change = std::abs(run.reference.gradient[sharpest]) * relative;
  run.under_test.gradient[sharpest] = run.reference.gradient[sharpest] * (1 + relative);
  p.run = std::move(run);
  return p;
}

// Negative control: a gradient element off by `relative` passes the worst-case bound and fails
// the per-element one.
void expect_only_the_per_element_bound_catches(const OneUpdate& run, const PrecisionPair& precisions,
                                               double relative) {
  const Perturbation wrong = perturbed(run, precisions, relative);
  std::cout << "perturbed by " << wrong.change << ": per-element bound " << wrong.per_element_bound
            << ", worst-case bound " << wrong.worst_case_bound << "\n";
  ASSERT_GT(wrong.change, wrong.per_element_bound);
  ASSERT_LT(wrong.change, wrong.worst_case_bound);
  EXPECT_TRUE(compare(wrong.run, precisions, false).ok()) << "the worst-case bound misses it";
  const Report caught = compare(wrong.run, precisions, true);
  EXPECT_FALSE(caught.ok());
  EXPECT_NE(caught.text().find("FAIL update 1 gradient"), std::string::npos) << caught.text();
}

// The norm's bound from per-element bounds, against sqrt(P) x the worst case.
void expect_a_sharper_norm_bound(const OneUpdate& run, const PrecisionPair& precisions, double factor) {
  const Report sharp = compare(run, precisions, true);
  const Report loose = compare(run, precisions, false);
  auto norm_bound_of = [](const Report& report) {
    for (const Finding& f : report.findings()) {
      if (f.quantity == "grad_norm") return f.bound;
    }
    return 0.0;
  };
  std::cout << "grad_norm bound: per-element " << norm_bound_of(sharp) << ", worst case "
            << norm_bound_of(loose) << "\n";
  EXPECT_GT(norm_bound_of(sharp), 0.0);
  EXPECT_LT(factor * norm_bound_of(sharp), norm_bound_of(loose));
}

TEST(ErrorBounds, ProductionFp32IsInsideThePerElementBoundsWhichCatchWhatTheWorstCaseMisses) {
  const PrecisionPair precisions{fp32(), fp64()};
  const OneUpdate run = one_update(reference_twin(), production_twin(false));
  const Report sharp = compare(run, precisions, true);
  std::cout << "per-element bounds:\n" << sharp.text(40);
  EXPECT_TRUE(sharp.ok()) << sharp.text();
  EXPECT_TRUE(compare(run, precisions, false).ok());
  expect_only_the_per_element_bound_catches(run, precisions, 1e-3);
  expect_a_sharper_norm_bound(run, precisions, 2);
}

TEST(ErrorBounds, TheDoubleReferenceIsInsideItsFloat50PerElementBoundsWhichCatchWhatTheWorstCaseMisses) {
  const PrecisionPair precisions{fp64(), float50()};
  const OneUpdate run = one_update(reference50_twin(), reference_twin());
  const Report sharp = compare(run, precisions, true);
  std::cout << "per-element bounds:\n" << sharp.text(40);
  EXPECT_TRUE(sharp.ok()) << sharp.text();
  expect_only_the_per_element_bound_catches(run, precisions, 1e-11);
  expect_a_sharper_norm_bound(run, precisions, 2);
}

// A reference gradient that does not cover the config's parameters is the caller's bug: the bounds
// say so instead of bounding the first elements and leaving the rest at the worst case (the
// per-element and the statistical bounds meet the gradient through the same check).
TEST(ErrorBounds, AReferenceGradientOfAnotherLengthThanTheParametersThrows) {
  PrecisionPair precisions{fp32(), fp64()};
  precisions.rigorous_only = true;
  OneUpdate run = one_update(reference_twin(), production_twin(false));
  EXPECT_NO_THROW(update_bounds(run.config, precisions, run.reference, run.reference.record.clip_coeff));
  run.reference.gradient.pop_back();
  EXPECT_THROW(update_bounds(run.config, precisions, run.reference, run.reference.record.clip_coeff),
               std::logic_error);
}

// Negative control for the statistical bounds (equivalence/statistical_bounds.hpp): a gradient
// element, the loss and the norm each off by kStatisticalMisses times their statistical bound fail
// it, while the rigorous bounds alone (PrecisionPair::rigorous_only) accept all three.
constexpr double kStatisticalMisses = 4.0;

TEST(ErrorBounds, TheStatisticalBoundsCatchErrorsOfAFewFp32RoundingsThatTheRigorousOnesAccept) {
  PrecisionPair precisions{fp32(), fp64()};
  OneUpdate run = one_update(reference_twin(), production_twin(false));
  const StatisticalBounds statistical = statistical_error_bounds(
      run.config, run.reference.before.params, run.reference.batch, precisions, /*seed=*/7);
  ASSERT_TRUE(statistical.finite);
  std::size_t largest = 0;  // an ordinary element: the gradient's largest
  for (std::size_t i = 0; i < run.reference.gradient.size(); ++i) {
    if (std::abs(run.reference.gradient[i]) > std::abs(run.reference.gradient[largest])) largest = i;
  }
  const double g = run.reference.gradient[largest];
  run.under_test.gradient[largest] = g + kStatisticalMisses * statistical.gradient[largest];
  run.under_test.record.loss = run.reference.record.loss + kStatisticalMisses * statistical.loss;
  run.under_test.record.grad_norm = run.reference.record.grad_norm + kStatisticalMisses * statistical.norm;
  std::cout << "relative changes: gradient " << kStatisticalMisses * statistical.gradient[largest] / std::abs(g)
            << ", loss " << kStatisticalMisses * statistical.loss / run.reference.record.loss << ", grad_norm "
            << kStatisticalMisses * statistical.norm / run.reference.record.grad_norm << "\n";

  precisions.rigorous_only = true;
  const Report rigorous = compare(run, precisions, true);
  EXPECT_TRUE(rigorous.ok()) << rigorous.text();
  precisions.rigorous_only = false;
  const Report caught = compare(run, precisions, true);
  const std::string text = caught.text();
  EXPECT_FALSE(caught.ok());
  for (const char* quantity : {"gradient", "loss", "grad_norm"}) {
    EXPECT_NE(text.find(std::string("FAIL update 1 ") + quantity), std::string::npos) << quantity << "\n" << text;
  }
}

// Issue 15 item 2: on ordinary fp32 cases a correct twin's error reaches at least 1 % of its
// bound (median) for gradients, norm and loss. Production fp32 against the double reference on
// kSharpnessCases fixed cases (the model above; seeds and token streams 1..N), each case's
// sharpness (comparison.hpp: error / bound over the elements whose bound is > 0) and its median
// over the cases. The cases are fixed and the host trainer deterministic, so the measured values
// (docs/EQUIVALENCE.md "Sharpness", printed by this test) change only with the code: a bound
// loosened 2x fails the loss floor, 3x the gradient's. Measured with the statistical bounds:
// gradient 0.0209, grad_norm 0.0266, loss 0.0142 (the rigorous bounds alone: 1.42e-5, 2.73e-6,
// 4.47e-5).
constexpr int kSharpnessCases = 8;
constexpr double kSharpnessGoal = 0.01;  // issue 15: the error at least 1 % of its bound
constexpr double kGradientMedianFloor = kSharpnessGoal;
constexpr double kNormFloor = kSharpnessGoal;
constexpr double kLossFloor = kSharpnessGoal;

double median(std::vector<double> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

TEST(ErrorBounds, OnOrdinaryFp32CasesTheErrorsReachAStatedShareOfTheirBounds) {
  const PrecisionPair precisions{fp32(), fp64()};
  std::vector<double> gradient_medians, norms, losses;
  for (int k = 1; k <= kSharpnessCases; ++k) {
    DocumentLayout documents = fixed_documents();
    documents.token_seed = static_cast<std::uint64_t>(k);
    const OneUpdate run =
        one_update(reference_twin(), production_twin(false), static_cast<std::uint64_t>(k), documents);
    const Report report = compare(run, precisions, true);
    ASSERT_TRUE(report.ok()) << report.text();
    const auto sharpness = report.sharpness();
    gradient_medians.push_back(sharpness.at("gradient").median);
    norms.push_back(sharpness.at("grad_norm").max);
    losses.push_back(sharpness.at("loss").max);
    std::cout << "case " << k << ":\n" << report.sharpness_text();
  }
  std::cout << "median over " << kSharpnessCases << " cases: gradient (case medians) "
            << median(gradient_medians) << ", grad_norm " << median(norms) << ", loss "
            << median(losses) << "\n";
  EXPECT_GE(median(gradient_medians), kGradientMedianFloor);
  EXPECT_GE(median(norms), kNormFloor);
  EXPECT_GE(median(losses), kLossFloor);
}

}  // namespace
}  // namespace tandem::equivalence
