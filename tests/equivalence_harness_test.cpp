// The equivalence harness in the default suite: every property of equivalence/properties.hpp
// against every twin under test (must hold), every negative control (must be caught), and the
// harness's own parts (our IEEE generator reaches every class; the tolerances can fail).
// Filter with --gtest_filter=Equivalence.<Property>__<twin> or NegativeControl.<mutant>__*;
// RC_PARAMS sets seed, case counts, or replays a failure.
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "equivalence/comparison.hpp"
#include "equivalence/float_generator.hpp"
#include "equivalence/generators.hpp"
#include "equivalence/gtest_registration.hpp"
#include "equivalence/tolerance.hpp"
#include "equivalence/twin.hpp"
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

// The clip threshold property's norms near 1e-6: with the top of an untied model scaled by 1e-6
// the gradient norm of an update case falls to within a factor of 100 of SPEC 6's epsilon, where
// the epsilon changes the coefficient (clip / norm and clip / (norm + 1e-6) differ by 1 % or more).
RC_GTEST_PROP(BoundaryGenerators, ScalingTheTopOfTheModelPutsTheNormNearTheClipEpsilon, ()) {
  const UpdateCase c = *update_case(CaseLimits{1, false, false});
  RunConfig config = with_layout(c.config, c.reference_layout);
  config.model.tie_embeddings = false;
  TwinSetup setup;
  setup.config = config;
  setup.samples = shipped_samples(config, c.documents);
  auto twin = reference_twin().make(setup);
  twin->load_state(with_the_top_of_the_model_scaled(twin->state(), config.model, 1e-6));
  const IterationRecord record = twin->run_iteration();
  if (record.loss_tokens == 0) return;  // no loss, no gradient
  RC_ASSERT(record.grad_norm > 1e-8);
  RC_ASSERT(record.grad_norm < 1e-4);
  RC_CLASSIFY(record.grad_norm < 1e-5 && record.grad_norm > 1e-7, "norm within 10x of 1e-6");
}

// The update cases draw Adam only where its step is bounded (beta1^2 < beta2, or the sign step
// of beta1 = 0): beta2 = 0 beside beta1 0.9 took an fp32 twin out of fp32's range (generators.cpp).
RC_GTEST_PROP(BoundaryGenerators, AdamIsDrawnOnlyWhereItsStepIsBounded, ()) {
  const UpdateCase c = *update_case();
  const double beta1 = c.config.optimizer.adam_beta1;
  const double beta2 = c.config.optimizer.adam_beta2;
  RC_ASSERT(beta1 == 0.0 || beta1 * beta1 < beta2);
  RC_CLASSIFY(beta2 == 0.0, "beta2 0");
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

// A twin whose records misreport by one ulp what they prove about themselves (clip_coeff, not the
// clip / (norm + 1e-6) of its own norm) passes every bound, and fails the report: each twin's
// records go through tandem audit's exact checks (issue 15 item 3).
class MisreportingTwin final : public Twin {
 public:
  explicit MisreportingTwin(std::unique_ptr<Twin> twin) : twin_(std::move(twin)) {}
  std::string description() const override { return "misreporting " + twin_->description(); }
  Precision precision() const override { return twin_->precision(); }
  IterationRecord run_iteration() override {
    IterationRecord record = twin_->run_iteration();
    if (record.clipped) record.clip_coeff = std::nextafter(record.clip_coeff, 0.0);
    return record;
  }
  TwinState state() const override { return twin_->state(); }
  void load_state(const TwinState& state) override { twin_->load_state(state); }
  std::vector<double> last_gradient() const override { return twin_->last_gradient(); }
  Sample consumed_sample(std::int64_t index) const override { return twin_->consumed_sample(index); }
  void save_checkpoint(const std::filesystem::path& directory) const override { twin_->save_checkpoint(directory); }
  void resume_from(const std::filesystem::path& directory) override { twin_->resume_from(directory); }

 private:
  std::unique_ptr<Twin> twin_;
};

TEST(Comparison, ARecordThatMisreportsItsClipCoefficientByOneUlpFailsTheReport) {
  RunConfig config;
  config.model.num_layers = 1;
  config.model.hidden_size = 8;
  config.model.num_attention_heads = 2;
  config.model.num_query_groups = 2;
  config.model.ffn_hidden_size = 8;
  config.model.vocab_size = kByteVocabularySize;
  config.model.padded_vocab_size = kByteVocabularySize;
  config.model.seq_length = 8;
  config.batch.micro_batch_size = 1;
  config.batch.global_batch_size = 2;
  config.schedule.lr = 1e-2;
  config.schedule.train_samples = 16;
  config.schedule.lr_decay_samples = 16;
  config.optimizer.clip_grad = 1e-3;  // far below the norm: every update clipped
  DocumentLayout documents;
  documents.lengths = {5, 9, 3, 12, 7};
  const auto samples = shipped_samples(config, documents);
  for (const bool misreporting : {false, true}) {
    TwinSetup setup;
    setup.config = config;
    setup.samples = samples;
    auto reference = reference_twin().make(setup);
    std::unique_ptr<Twin> under_test = reference_twin().make(setup);
    if (misreporting) under_test = std::make_unique<MisreportingTwin>(std::move(under_test));
    Report report;
    run_teacher_forced(*reference, *under_test, 2, config, {fp64(), fp64()}, report);
    EXPECT_EQ(report.ok(), !misreporting) << report.text();
    if (misreporting) {
      EXPECT_NE(report.text().find("record of the twin under test: clip_coeff"), std::string::npos) << report.text();
    }
  }
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

// A bound is never negative (issue 15 saw a negative AdamW bound): one that is negative or NaN
// fails its finding loudly, even where both values agree exactly, and names itself.
TEST(Comparison, ANegativeOrNanBoundFailsItsFindingEvenWithNoError) {
  for (const double broken : {-1e-9, std::numeric_limits<double>::quiet_NaN()}) {
    Report report;
    Finding equal;
    equal.quantity = "params";
    equal.comparison = Comparison::approximate;
    equal.reference = 0.5;
    equal.under_test = 0.5;
    equal.bound = broken;
    report.add(equal);
    EXPECT_FALSE(report.ok()) << broken;
    EXPECT_NE(report.text().find("broken bound"), std::string::npos) << report.text();
  }
  // A NaN bound beside non-finite values is no bound at all: those are compared by class.
  Report skipped;
  Finding nan_norm;
  nan_norm.quantity = "grad_norm";
  nan_norm.comparison = Comparison::approximate;
  nan_norm.reference = std::numeric_limits<double>::quiet_NaN();
  nan_norm.under_test = nan_norm.reference;
  nan_norm.bound = nan_norm.reference;
  skipped.add(nan_norm);
  EXPECT_TRUE(skipped.ok()) << skipped.text();
}

// The AdamW bound is one for any lr and wd it is handed: the error of p - lr (a + wd p) depends
// on their magnitudes only, so a sign flip leaves it unchanged (it came out negative before).
TEST(Tolerance, AnAdamwElementBoundIsTheSameForANegatedLrAndWd) {
  AdamwElementInput in;
  in.param = 0.5;
  in.exp_avg = 1.0 / 16;
  in.exp_avg_sq = 1.0 / 64;
  in.grad = 0.375;
  in.grad_error = 1.0 / 1024;
  in.lr = 1.0 / 128;
  in.wd = 0.125;
  in.beta1 = 0.75;
  in.beta2 = 0.875;
  in.eps = 1e-8;
  in.step = 3;
  const AdamwElementBound positive = adamw_element_bound(in, {fp32(), fp64()});
  in.lr = -in.lr;
  in.wd = -in.wd;
  const AdamwElementBound negated = adamw_element_bound(in, {fp32(), fp64()});
  EXPECT_GT(positive.param, 0.0);
  EXPECT_EQ(negated.param, positive.param);
  EXPECT_EQ(negated.exp_avg, positive.exp_avg);
  EXPECT_EQ(negated.exp_avg_sq, positive.exp_avg_sq);
}

// The sharpness of a quantity's bound: error / bound over its findings with a bound > 0 (a zero
// bound, an exact element, says nothing about it), median, 90th percentile and maximum.
TEST(Comparison, SharpnessIsTheErrorOverTheBoundOfEveryFindingWithABound) {
  Report report;
  Finding f;
  f.quantity = "gradient";
  f.comparison = Comparison::approximate;
  f.bound = 8;
  for (int k = 0; k <= 10; ++k) {  // ratios 0, 1/16, ..., 10/16
    f.error = k / 2.0;
    report.add(f);
  }
  f.bound = 0;  // an exact element: left out
  f.error = 0;
  report.add(f);
  Finding loss;
  loss.quantity = "loss";
  loss.comparison = Comparison::approximate;
  loss.error = 1;
  loss.bound = 4;
  report.add(loss);
  const auto sharpness = report.sharpness();
  ASSERT_EQ(sharpness.size(), 2u);
  const Sharpness& g = sharpness.at("gradient");
  EXPECT_EQ(g.compared, 11);
  EXPECT_EQ(g.median, 5.0 / 16);
  EXPECT_EQ(g.p90, 9.0 / 16);
  EXPECT_EQ(g.max, 10.0 / 16);
  EXPECT_EQ(sharpness.at("loss").max, 1.0 / 4);
  EXPECT_NE(report.sharpness_text().find("sharpness (error / bound) loss: 0.25"), std::string::npos)
      << report.sharpness_text();
}

TEST(Verdict, AgreementIsTheIdentityWithOneProcess) {
  EXPECT_TRUE(agree_on_verdict(true));
  EXPECT_FALSE(agree_on_verdict(false));
  EXPECT_EQ(agree_on_seed(42), 42u);
}

}  // namespace
}  // namespace tandem::equivalence
