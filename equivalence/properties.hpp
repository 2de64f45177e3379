// The harness's properties, each a sentence with its comparison class and named tolerance, and
// the registry that runs them against a twin kind (the twins under test, or a mutant). Tests
// register one gtest per (property, twin) from this registry (tests/equivalence_*_test.cpp), so
// `--gtest_filter=Equivalence.UpdatesMatchTheReference*` picks cases by name; RC_PARAMS sets the
// seed, the case count, or replays a failure (`RC_PARAMS="reproduce=..."`, printed on failure).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "equivalence/tolerance.hpp"
#include "equivalence/twin.hpp"

namespace tandem::equivalence {

struct PropertyEntry {
  std::string name;       // "UpdatesMatchTheReference": the gtest name
  std::string sentence;   // "the twin under test equals the reference, update by update"
  Comparison comparison;  // the strictest class it uses
  std::string tolerance;  // the named tolerance and where its derivation lives
  int default_cases = 100;                         // the default suite's case count
  std::function<bool(const TwinKind&)> applies;    // e.g. needs checkpoints
  std::function<void(const TwinKind&)> body;       // draws its case; RC_ASSERT inside
  std::vector<Mutant> must_catch;                  // negative controls it is required to fail
  bool control_only = false;  // a weaker variant that exists to show a control is caught by it
};

// Every property, in the order a report lists them.
const std::vector<PropertyEntry>& properties();
const PropertyEntry& property(const std::string& name);  // throws std::out_of_range

struct CheckOptions {
  int cases = 100;                     // unless RC_PARAMS sets max_success
  std::optional<std::uint64_t> seed;   // unless RC_PARAMS sets seed; none: RapidCheck's
  bool shrink = true;
  bool quiet_listener = false;         // negative controls: no reproduce line at exit
};

// The sharpness of one quantity's bound over the passing cases of a run (a bound far above every
// error accepts wrong values too), from each case's Report::sharpness() (comparison.hpp): the
// UpdatesMatch properties tally it per quantity and precision pair ("gradient fp32/fp64").
struct SharpnessTally {
  std::vector<double> case_medians;  // per case: median of error / bound over its values
  std::vector<double> case_maxima;   // per case: the largest error / bound
  double median_of_case_medians() const;  // 0 with no case
  double max_of_case_maxima() const;      // 0 with no case
};
// One line per quantity: the median and minimum of the case medians, the largest maximum.
std::string sharpness_summary(const std::map<std::string, SharpnessTally>& tally);

struct CheckOutcome {
  bool holds = false;          // the property held for every case
  bool failed = false;         // a counterexample was found (GaveUp/Error are neither)
  std::uint64_t seed = 0;
  int cases_run = 0;
  std::string message;         // RapidCheck's result message (counterexample, shrunk case)
  std::map<std::string, SharpnessTally> sharpness;  // quantity + precision pair -> tally
};

// Runs `property` against `twin` and prints a header (sentence, twin, class, tolerance, seed,
// case count, how to reproduce), RapidCheck's result and the sharpness summary to `log`.
CheckOutcome check_property(const PropertyEntry& property, const TwinKind& twin,
                            const CheckOptions& options, std::ostream& log);

// The case count a property gets when RC_PARAMS does not set one: the default suite's, or the
// soak's (10,000).
int case_count(const PropertyEntry& property, bool soak);

}  // namespace tandem::equivalence
