// The harness's property registry and its check (properties.hpp). The properties themselves are
// in properties_<family>.cpp, their shared case handling in properties_cases.cpp
// (properties_internal.hpp).
#include "equivalence/properties.hpp"

#include <algorithm>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>

#include "equivalence/properties_internal.hpp"
#include "equivalence/verdict.hpp"

namespace tandem::equivalence {
namespace {

// The soak's case count (ctest -L soak).
constexpr int kSoakCases = 10000;

// The sharpness of the bounds over the cases of the check_property run in progress
// (check_property moves it into its outcome).
std::map<std::string, SharpnessTally>& running_tally() {
  static std::map<std::string, SharpnessTally> tally;
  return tally;
}

// Adds a passing case's sharpness per quantity, keyed by the precisions compared ("gradient
// fp32/fp64"), for the properties that name them (the update comparisons); a failing case's
// ratio is above 1 and its report says so.
void tally_sharpness(const Report& report, const PrecisionPair* precisions) {
  if (!report.ok() || precisions == nullptr) return;
  const std::string pair = " " + precisions->under_test.name + "/" + precisions->reference.name;
  for (const auto& [quantity, sharpness] : report.sharpness()) {
    SharpnessTally& tally = running_tally()[quantity + pair];
    tally.case_medians.push_back(sharpness.median);
    tally.case_maxima.push_back(sharpness.max);
  }
}

}  // namespace

void assert_report(const Report& report, const PrecisionPair* precisions) {
  tally_sharpness(report, precisions);
  const bool holds = agree_on_verdict(report.ok());
  if (!holds) RC_LOG() << report.text();
  RC_ASSERT(holds);
}

namespace {

// The default suite's case counts were doubled when the cpu backend's blocked kernels made a
// case about twice as cheap at the harness's sizes (docs/PERFORMANCE.md "The cpu backend").
std::vector<PropertyEntry> make_properties() {
  const auto always = [](const TwinKind&) { return true; };
  std::vector<PropertyEntry> entries;
  entries.push_back(
      {"UpdatesMatchTheReference",
       "the twin under test equals the reference update by update, from the same state",
       Comparison::approximate,
       "counters, lr, wd, step, flags and consumed samples exact; loss, norm, clip coefficient, "
       "gradient, weights, m, v within tolerance.hpp's norm/AdamW-element bounds and, per "
       "element, the smallest of error_bounds.hpp's first-order bound, tolerance.hpp's worst "
       "case (gamma_n of both arithmetics, n = GBS x seq x max(d, F, V)) and, without bf16, "
       "statistical_bounds.hpp's (exceeded with probability 1e-12 under its rounding model)",
       400, always, updates_match_the_reference,
       {Mutant::decay_norm_weights, Mutant::l2_instead_of_decoupled, Mutant::clip_per_rank,
        Mutant::eps_inside_sqrt, Mutant::bias_correction_off_by_one,
        Mutant::scheduler_advances_on_skip, Mutant::cross_document_attention,
        Mutant::positions_not_reset, Mutant::unreduced_gradients,
        Mutant::rank_local_loss_denominator, Mutant::shard_local_norm,
        Mutant::unsummed_sequence_parallel_gradients, Mutant::replicated_counted_per_rank,
        Mutant::local_vocabulary_normalizer, Mutant::row_parallel_summed_twice,
        Mutant::row_parallel_not_summed, Mutant::tied_embedding_not_summed,
        Mutant::tied_embedding_counted_twice, Mutant::stage_local_norm, Mutant::microbatches_out_of_order,
        Mutant::last_stage_microbatch_loss, Mutant::production_clip_without_epsilon,
        Mutant::adam_epsilon_scaled_by_bias_correction, Mutant::loss_scale_one_part_in_a_billion,
        Mutant::norm_squares_summed_in_fp32}});
  entries.push_back(
      {"TrainingOutputsMatchTheReference",
       "the twin under test's training outputs alone (no sample inspection) equal the reference's",
       Comparison::approximate, "as UpdatesMatchTheReference", 40, always,
       training_outputs_match_the_reference,
       {Mutant::cross_document_attention, Mutant::positions_not_reset}, /*control_only=*/true});
  entries.push_back(
      {"AccumulatedMicrobatchesEqualTheDirectGlobalBatch",
       "accumulated microbatches equal the direct global batch, for every split and DP size",
       Comparison::approximate,
       "lr and loss tokens exact; gradient within (gamma_n(u) + gamma_n(u)) max|g| GBS, norm and "
       "loss within their bounds (tolerance.hpp)",
       200, always, accumulated_microbatches_equal_the_direct_global_batch,
       {Mutant::microbatch_mean_under_per_token}});
  entries.push_back(
      {"ASkippedUpdateChangesOnlyIterationConsumedSamplesAndTheSkipCounter",
       "a skipped update changes nothing but iteration, consumed samples, the skip counters and "
       "the token totals of the batch it read",
       Comparison::exact, "none: weights, moments, step and scheduler bitwise unchanged", 400,
       always, a_skipped_update_changes_only_the_counters_it_names,
       {Mutant::scheduler_advances_on_skip}});
  entries.push_back(
      {"SaveStopResumeEqualsRunningStraight",
       "save, stop, resume equals running straight, bitwise", Comparison::deterministic,
       "none: weights, moments, counters and every later record bitwise equal", 300,
       [](const TwinKind& kind) { return kind.checkpoints; },
       save_stop_resume_equals_running_straight, {}});
  entries.push_back(
      {"MicrobatchMeanDiffersFromPerTokenExactlyWhenLossTokenCountsDiffer",
       "per-microbatch-mean normalization differs from per-token exactly when loss-token counts "
       "differ (documents with content: see the property's comment)",
       Comparison::exact,
       "equal counts: bitwise equal gradients; different counts: a difference beyond the "
       "gradient bound",
       400, always, microbatch_mean_differs_exactly_when_loss_token_counts_differ,
       {Mutant::microbatch_mean_under_per_token}});
  entries.push_back(
      {"TheClipDecisionHoldsAtItsThresholdWithin1e7",
       "with the clip threshold 1e-7 relative below or above its own norm + 1e-6, the twin clips "
       "exactly when SPEC 6 says and by clip / (norm + 1e-6)",
       Comparison::exact, "none: norm (against its own probe), clipped and clip_coeff bit for bit",
       100, always, the_clip_decision_holds_within_1e7_of_its_threshold, {Mutant::clip_without_epsilon}});
  entries.push_back(
      {"AdamwElementMatchesSpec7OnEveryIeeeInput",
       "one AdamW element update equals SPEC 7 for every IEEE input, NaN, infinities, "
       "subnormals and -0 included",
       Comparison::exact,
       "same arithmetic: exact (class, sign, value); otherwise classes then the AdamW element "
       "bound",
       5000, [](const TwinKind& kind) { return static_cast<bool>(kind.adamw_element); },
       adamw_element_matches_spec7_on_every_ieee_input,
       {Mutant::l2_instead_of_decoupled, Mutant::eps_inside_sqrt,
        Mutant::bias_correction_off_by_one}});
  return entries;
}

// A listener that reports nothing (negative controls fail on purpose).
class QuietListener final : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

bool rc_params_set(const char* key) {
  const char* params = std::getenv("RC_PARAMS");
  return params != nullptr && std::string(params).find(key) != std::string::npos;
}

}  // namespace

const std::vector<PropertyEntry>& properties() {
  static const std::vector<PropertyEntry> entries = make_properties();
  return entries;
}

const PropertyEntry& property(const std::string& name) {
  for (const auto& entry : properties()) {
    if (entry.name == name) return entry;
  }
  throw std::out_of_range("no equivalence property named " + name);
}

double SharpnessTally::median_of_case_medians() const {
  std::vector<double> medians = case_medians;
  if (medians.empty()) return 0;
  const auto middle = medians.begin() + static_cast<std::ptrdiff_t>(medians.size() / 2);
  std::nth_element(medians.begin(), middle, medians.end());
  return *middle;
}

double SharpnessTally::max_of_case_maxima() const {
  return case_maxima.empty() ? 0 : *std::max_element(case_maxima.begin(), case_maxima.end());
}

std::string sharpness_summary(const std::map<std::string, SharpnessTally>& tally) {
  if (tally.empty()) return "";
  std::ostringstream os;
  os << std::setprecision(3)
     << "sharpness of the bounds (error / bound; per case the median over its values with a bound "
        "> 0, and the maximum):\n";
  for (const auto& [quantity, t] : tally) {
    const auto cases = t.case_medians.size();
    os << "  " << quantity << ": median of the case medians " << t.median_of_case_medians()
       << ", min " << *std::min_element(t.case_medians.begin(), t.case_medians.end())
       << "; largest case maximum " << t.max_of_case_maxima() << " (" << cases
       << (cases == 1 ? " case" : " cases") << ")\n";
  }
  return os.str();
}

int case_count(const PropertyEntry& property, bool soak) {
  return soak ? kSoakCases : property.default_cases;
}

CheckOutcome check_property(const PropertyEntry& property, const TwinKind& twin,
                            const CheckOptions& options, std::ostream& log) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  if (!rc_params_set("max_success")) params.maxSuccess = options.cases;
  if (options.seed && !rc_params_set("seed")) params.seed = *options.seed;
  params.seed = agree_on_seed(params.seed);  // every rank draws the same cases
  params.disableShrinking = params.disableShrinking || !options.shrink;

  rc::detail::TestMetadata metadata;
  metadata.id = property.name + "/" + twin.name;
  metadata.description = property.sentence;
  log << "property: " << property.sentence << "\n"
      << "  twin under test: " << twin.description << " [" << twin.name << "]\n"
      << "  comparison: " << to_string(property.comparison) << "; tolerance: " << property.tolerance
      << "\n"
      << "  seed " << params.seed << ", " << params.maxSuccess << " cases; rerun these cases with "
      << "RC_PARAMS=\"seed=" << params.seed << " max_success=" << params.maxSuccess << "\"\n";

  running_tally().clear();
  const auto body = [&property, &twin] { property.body(twin); };
  QuietListener quiet;
  const rc::detail::TestResult result =
      options.quiet_listener
          ? rc::detail::checkTestable(body, metadata, params, quiet)
          : rc::detail::checkTestable(body, metadata, params);
  CheckOutcome outcome;
  outcome.seed = params.seed;
  outcome.holds = result.template is<rc::detail::SuccessResult>();
  outcome.failed = result.template is<rc::detail::FailureResult>();
  std::ostringstream message;
  rc::detail::printResultMessage(result, message);
  outcome.message = message.str();
  if (outcome.holds) {
    outcome.cases_run = result.template get<rc::detail::SuccessResult>().numSuccess;
  } else if (outcome.failed) {
    outcome.cases_run = result.template get<rc::detail::FailureResult>().numSuccess + 1;
    outcome.message += "\n(seed " + std::to_string(params.seed) + "; RapidCheck prints the " +
                       "RC_PARAMS=\"reproduce=...\" string for this failure when the program exits)";
  }
  outcome.sharpness = std::move(running_tally());
  running_tally().clear();
  log << outcome.message << "\n" << sharpness_summary(outcome.sharpness);
  return outcome;
}

}  // namespace tandem::equivalence
