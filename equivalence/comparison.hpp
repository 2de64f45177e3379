// One update of a twin under test held against the reference from the same state (teacher
// forcing), quantity by quantity, each with its comparison class (tolerance.hpp):
//   exact        iteration, consumed samples, successful/skipped/consecutive skips, token
//                counters, scheduler samples, step, lr, wd, clipped, update_successful, and the
//                samples the twin consumed (tokens, labels, loss mask, positions, attention spans);
//   approximate  loss, grad_norm, clip_coeff, the main gradient, weights, m and v, within the
//                bounds of tolerance.hpp, sharpened per element by error_bounds.hpp where it
//                applies (update_bounds). NaN/Inf and sign classes are compared first.
// The report prints, per update and quantity, both values, the error, the bound and the error as
// a share of the bound (STYLE: the exit status is the verdict, the report the diagnosis), and per
// approximate quantity the sharpness of its bound (the error over the bound, its median and
// maximum over every compared element): a bound far above every error it sees accepts wrong
// values as readily as right ones, so its looseness is shown, not hidden.
// A bound that is negative or NaN where both values are finite is a broken derivation: that
// finding fails, whatever the error.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/model_layout.hpp"
#include "equivalence/tolerance.hpp"
#include "equivalence/twin.hpp"

namespace tandem::equivalence {

struct Finding {
  std::int64_t update = 0;    // 1-based update of the comparison
  std::string quantity;       // "loss", "params", "counters.scheduler_samples", ...
  std::string where;          // tensor[element] or sample index; empty for scalars
  Comparison comparison = Comparison::exact;
  double reference = 0;
  double under_test = 0;
  double error = 0;           // |reference - under_test| (inf on a class mismatch)
  double bound = 0;           // 0 for exact comparisons
  bool ok = true;
};

// How sharp the bound of one approximate quantity was: error / bound over its findings whose
// values are finite and whose bound is > 0 (elements whose bound is 0 must agree exactly and say
// nothing about sharpness). For a scalar (loss, grad_norm) each statistic is its one ratio per
// update.
struct Sharpness {
  std::int64_t compared = 0;  // findings counted
  double median = 0;
  double p90 = 0;             // 90th percentile
  double max = 0;
};

// Findings of a comparison: every failing one (up to a cap) and the worst of each quantity.
class Report {
 public:
  // Keeps failures and the worst per (update, quantity); counts each approximate finding's
  // error / bound into its quantity's sharpness. Fails a finding whose bound is negative or NaN.
  void add(const Finding& finding);
  bool ok() const { return failures_ == 0; }
  std::int64_t failures() const { return failures_; }
  const std::vector<Finding>& findings() const { return findings_; }
  // One line per finding: update, quantity, where, reference, under test, error, bound, % of bound.
  std::string text(std::size_t max_lines = 40) const;
  void note(const std::string& line) { notes_.push_back(line); }
  // Per approximate quantity ("gradient", "grad_norm", ...), over every update added.
  std::map<std::string, Sharpness> sharpness() const;
  // One line per quantity: "sharpness (error / bound) gradient: median ..., p90 ..., max ... over
  // N elements".
  std::string sharpness_text() const;

 private:
  // quantity -> error / bound, in float: one per compared element (a report of a large model holds
  // several per parameter), three digits are shown.
  std::map<std::string, std::vector<float>> ratios_;
  std::vector<Finding> findings_;
  std::map<std::pair<std::int64_t, std::string>, std::size_t> worst_;  // -> index in findings_
  std::vector<std::string> notes_;
  std::int64_t failures_ = 0;
};

// What one update of one twin produced.
struct UpdateObservation {
  IterationRecord record;
  TwinState before;
  TwinState after;
  std::vector<double> gradient;  // the main gradient the optimizer used (post-clip)
  // [GBS] the update's samples in global order (the reference's): with them the gradient, norm
  // and loss are held to equivalence/error_bounds.hpp's per-element bounds; without them (or
  // with bf16) to tolerance.hpp's worst case.
  std::vector<Sample> batch;
};

// Whether the harness's properties hold their cases to the statistical bounds too
// (equivalence/statistical_bounds.hpp): yes unless the environment sets
// TANDEM_EQUIVALENCE_BOUNDS=rigorous (ci/test's sanitizer runs, where the probes' arithmetic would
// take most of the time and tests nothing about memory or threads; harness_pair, which the
// properties and the model-parallel tests' compare_with_the_reference use, follows it; tests that
// build their own PrecisionPair, and tandem check, are not affected). Any other value than "rigorous" or "statistical" throws
// std::invalid_argument.
bool statistical_bounds_enabled();

// The precisions the harness holds a case to: the rigorous bounds alone under
// TANDEM_EQUIVALENCE_BOUNDS=rigorous (statistical_bounds_enabled).
PrecisionPair harness_pair(const Precision& under_test, const Precision& reference);

// The bounds an update's gradient (before clipping), norm and loss are held to: tolerance.hpp's
// worst case, and where the reference's batch is known and no side stores bf16, per element the
// smallest of it, error_bounds.hpp's first-order bound (norm: from the elements' bounds) and,
// unless PrecisionPair::rigorous_only, statistical_bounds.hpp's.
struct UpdateBounds {
  std::vector<double> gradient;  // [P] |g_test - g_ref| before clipping
  double norm = 0;
  double loss = 0;
};
// `reference`: record, before.params, gradient (after clipping by `clip_coeff`) and batch.
UpdateBounds update_bounds(const RunConfig& config, const PrecisionPair& precisions,
                           const UpdateObservation& reference, double clip_coeff);

// Compares one update of the twin under test with the reference's update from the same state.
void compare_update(std::int64_t update, const RunConfig& config, const ModelLayout& layout,
                    const PrecisionPair& precisions, const UpdateObservation& reference,
                    const UpdateObservation& under_test, Report& report);

// Exact comparison of the samples the twin consumes with the shipped ones.
void compare_samples(std::int64_t update, const Sample& reference, const Sample& under_test,
                     Report& report);

// Exact comparison of two states (deterministic class: resume, skipped updates).
void compare_states_bitwise(std::int64_t update, const std::string& what, const TwinState& reference,
                            const TwinState& under_test, Report& report);

// The samples of the update that starts from `before` ([GBS], global order), as `twin` consumes
// them: UpdateObservation::batch.
std::vector<Sample> update_batch(const Twin& twin, const TwinState& before, const RunConfig& config);

// Runs `updates` updates of `under_test`, each held against `reference` loaded with the twin's
// own state first. Both must have been built on the same samples and injection.
void run_teacher_forced(Twin& reference, Twin& under_test, std::int64_t updates,
                        const RunConfig& config, const PrecisionPair& precisions, Report& report,
                        const std::function<void(std::int64_t, const UpdateObservation&,
                                                 const UpdateObservation&)>& on_update = {},
                        bool compare_consumed_samples = true);

}  // namespace tandem::equivalence
