// The equivalence harness in the default suite: every property of equivalence/properties.hpp
// against every twin under test (must hold), every negative control (must be caught), and the
// harness's own parts (our IEEE generator reaches every class; the tolerances can fail).
// Filter with --gtest_filter=Equivalence.<Property>__<twin> or NegativeControl.<mutant>__*;
// RC_PARAMS sets seed, case counts, or replays a failure.
#include <cmath>
#include <limits>
#include <set>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "equivalence/comparison.hpp"
#include "equivalence/float_generator.hpp"
#include "equivalence/generators.hpp"
#include "equivalence/gtest_registration.hpp"
#include "equivalence/tolerance.hpp"
#include "equivalence/verdict.hpp"

namespace tandem::equivalence {
namespace {

// Negative-control case budget: every control must be caught within this many cases.
constexpr int kControlCases = 400;

const bool registered = [] {
  register_equivalence_properties("Equivalence", /*soak=*/false);
  register_negative_controls("NegativeControl", kControlCases);
  return true;
}();

// ---- the boundary generators ----

// A single-loss-token case holds exactly one loss token in every global batch whose unedited
// samples have any (none otherwise), wherever the batch starts (exact counts): 10 global batches
// of each case.
RC_GTEST_PROP(BoundaryGenerators, ASingleLossTokenCaseHasOneLossTokenInEveryGlobalBatch, ()) {
  UpdateCase c = *update_case();
  const RunConfig config = with_layout(c.config, c.reference_layout);
  c.documents.single_loss_token = false;
  const auto unedited = shipped_samples(config, c.documents);
  c.documents.single_loss_token = true;
  const auto edited = shipped_samples(config, c.documents);
  const std::int64_t gbs = config.batch.global_batch_size;
  for (std::int64_t batch = 0; batch < 10; ++batch) {
    std::int64_t before = 0, after = 0;
    for (std::int64_t index = batch * gbs; index < (batch + 1) * gbs; ++index) {
      before += unedited(index).loss_tokens;
      const Sample sample = edited(index);
      std::int64_t masked = 0;
      for (const std::uint8_t mask : sample.loss_mask) masked += mask;
      RC_ASSERT(sample.loss_tokens == masked);
      after += sample.loss_tokens;
    }
    RC_ASSERT(after == (before > 0 ? 1 : 0));
    if (batch == 0) RC_CLASSIFY(after == 1, "the first global batch has its one loss token");
  }
}

// ---- our IEEE generator ----

template <class Float>
std::set<std::string> classes_reached(int cases) {
  std::set<std::string> reached;
  rc::detail::TestParams params;
  params.maxSuccess = cases;
  params.seed = 7;
  const auto result = rc::detail::checkTestable(
      [&reached] {
        const Float value = *ieee_value<Float>();
        std::string name = to_string(classify(value));
        if (classify(value) != FloatClass::nan) name += std::signbit(value) ? "-" : "+";
        reached.insert(name);
      },
      rc::detail::TestMetadata{}, params);
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>());
  return reached;
}

TEST(IeeeGenerator, ReachesNanInfinitiesSubnormalsAndBothZeros) {
  const std::set<std::string> every = {"nan",        "+inf+",       "-inf-",   "zero+", "zero-",
                                       "subnormal+", "subnormal-", "normal+", "normal-"};
  EXPECT_EQ(classes_reached<double>(3000), every);
  EXPECT_EQ(classes_reached<float>(3000), every);
}

RC_GTEST_PROP(IeeeGenerator, FiniteOnlyNeverDrawsNanOrInfinity, ()) {
  const double value = *ieee_value<double>(only_finite());
  RC_ASSERT(std::isfinite(value));
}

RC_GTEST_PROP(IeeeGenerator, NonfiniteOnlyDrawsOnlyNanOrInfinity, ()) {
  const float value = *ieee_value<float>(only_nonfinite());
  RC_ASSERT(!std::isfinite(value));
}

TEST(IeeeGenerator, ExactComparisonSeesTheSignOfZeroAndAnyNan) {
  EXPECT_TRUE(same_ieee_value(0.0, 0.0));
  EXPECT_FALSE(same_ieee_value(0.0, -0.0));
  EXPECT_TRUE(same_ieee_value(std::nan(""), -std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(same_ieee_value(std::nan(""), 1.0));
  EXPECT_FALSE(same_ieee_value(1.0, std::nextafter(1.0, 2.0)));
}

// ---- tolerances ----

TEST(Tolerance, GammaIsNuOverOneMinusNuAndInfiniteWithoutABound) {
  EXPECT_EQ(gamma(0, fp64().unit_roundoff), 0.0);
  const double u = std::ldexp(1.0, -53);
  EXPECT_DOUBLE_EQ(gamma(1024, u), 1024 * u / (1 - 1024 * u));
  EXPECT_TRUE(std::isinf(gamma(256, bf16().compute_roundoff)));  // 256 x 2^-8 = 1
}

TEST(Tolerance, TheGradientBoundMatchesTheReferenceTrainerTestsDerivation) {
  // tests/reference_trainer_test.cpp: 2 x terms x 2^-53 x max|g| x GBS for two double orders
  // (first order: gamma_n ~ n u).
  RunConfig config;
  config.model.hidden_size = 16;
  config.model.ffn_hidden_size = 32;
  config.model.num_attention_heads = 4;
  config.model.num_query_groups = 2;
  config.model.seq_length = 16;
  config.batch.global_batch_size = 8;
  const ReductionShape shape = reduction_shape(config);
  EXPECT_EQ(shape.gradient_terms, 8 * 16 * 384);
  const double bound = gradient_bound(shape, {fp64(), fp64()}, 1.0);
  const double first_order = 2.0 * 8 * 16 * 384 * std::ldexp(1.0, -53) * 8;
  EXPECT_NEAR(bound, first_order, 1e-6 * first_order);
}

TEST(Tolerance, AnAdamwElementWithAnExactGradientIsBoundedByItsOwnRoundingOnly) {
  // g known exactly, b1 = b2 = 0, lr = 1: the step is g/(|g| + eps) = sign step; two double
  // evaluations differ by a few ulps only, and the bound says so (a few 1e-16, not 1e-8).
  AdamwElementInput in;
  in.param = 0.5;
  in.grad = 0.375;
  in.lr = 1;
  in.eps = 1e-8;
  const AdamwElementBound bound = adamw_element_bound(in, {fp64(), fp64()});
  EXPECT_GT(bound.param, 0.0);
  EXPECT_LT(bound.param, 64 * std::numeric_limits<double>::epsilon());
}

TEST(Comparison, AReportFailsOnAValueOutsideItsBoundAndOnAClassMismatch) {
  Report report;
  Finding inside;
  inside.quantity = "loss";
  inside.comparison = Comparison::approximate;
  inside.error = 1e-17;
  inside.bound = 1e-16;
  report.add(inside);
  EXPECT_TRUE(report.ok());
  Finding outside = inside;
  outside.ok = false;
  report.add(outside);
  EXPECT_FALSE(report.ok());
  EXPECT_NE(report.text().find("FAIL"), std::string::npos);
}

// A failed finding shows its error as a share of its bound (it printed "inf%" before).
TEST(Comparison, AFailedFindingShowsItsErrorAsAShareOfTheBound) {
  Report report;
  Finding outside;
  outside.quantity = "gradient";
  outside.comparison = Comparison::approximate;
  outside.error = 3.0;
  outside.bound = 2.0;
  outside.ok = false;
  report.add(outside);
  EXPECT_NE(report.text().find("(150% of the bound)"), std::string::npos) << report.text();
}

TEST(Verdict, AgreementIsTheIdentityWithOneProcess) {
  EXPECT_TRUE(agree_on_verdict(true));
  EXPECT_FALSE(agree_on_verdict(false));
  EXPECT_EQ(agree_on_seed(42), 42u);
}

}  // namespace
}  // namespace tandem::equivalence
