// Google Test registration of the equivalence registry (header-only; included by the test
// executables only, so the library itself does not depend on Google Test). One test per
// (property, twin kind), named `<Suite>.<Property>__<twin>` (`<Suite>.Soak<Property>__<twin>` in the
// soak), so `--gtest_filter` selects cases by property and twin; one negative control per (mutant, property that must catch it), which
// REQUIRES the property to fail.
#pragma once

#include <cctype>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "equivalence/comparison.hpp"
#include "equivalence/properties.hpp"
#include "equivalence/twin.hpp"

namespace tandem::equivalence {

inline std::string gtest_name(std::string text) {
  for (char& ch : text) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return text;
}

class RegisteredCheck : public ::testing::Test {
 public:
  explicit RegisteredCheck(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

inline void register_check(const std::string& suite, const std::string& name,
                           std::function<void()> body) {
  ::testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new RegisteredCheck(body); });
}

// The default suite's seed for a test: fixed (FNV-1a of its name), so that CI on a given commit
// draws the same cases every run and a red run is the commit's, not the draw's. The soak draws a
// new seed each run (RapidCheck's), to explore; RC_PARAMS="seed=..." overrides either.
inline std::uint64_t default_suite_seed(const std::string& test_name) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const char ch : test_name) {
    hash = (hash ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  return hash;
}

// Every property against each of `twins`: the property must hold.
inline void register_equivalence_properties(const std::string& suite, bool soak,
                                            const std::vector<TwinKind>& twins) {
  for (const PropertyEntry& entry : properties()) {
    for (const TwinKind& twin : twins) {
      if (entry.control_only || !entry.applies(twin)) continue;
      // tests/CMakeLists.txt labels every test named `*.Soak*` as `soak`.
      const std::string name = (soak ? "Soak" : "") + entry.name + "__" + gtest_name(twin.name);
      register_check(suite, name, [name = entry.name, twin, soak, seed = default_suite_seed(suite + "." + name)] {
        const PropertyEntry& property = equivalence::property(name);
        CheckOptions options;
        options.cases = case_count(property, soak);
        if (!soak) options.seed = seed;
        const CheckOutcome outcome = check_property(property, twin, options, std::cout);
        EXPECT_TRUE(outcome.holds) << outcome.message;
      });
    }
  }
}

// Every property against every twin under test (twins_under_test()).
inline void register_equivalence_properties(const std::string& suite, bool soak) {
  register_equivalence_properties(suite, soak, twins_under_test());
}

// Every mutant against every property that must catch it: the property must FAIL. A control the
// harness does not catch is a hole in the harness. The seed is fixed so a control is reproducible;
// shrinking is off (the counterexample is printed as found) except for the cheap element
// property, which shows that failures shrink.
// The whole-update controls run twice: at the mutant's own double bounds, and at the fp32/bf16
// bounds production is held to (a tolerance too loose to catch them would be a hole too).
inline void register_negative_controls(const std::string& suite, int cases) {
  std::uint64_t seed = 20261130;
  for (const PropertyEntry& entry : properties()) {
    const bool whole_update =
        entry.name == "UpdatesMatchTheReference" || entry.name == "TrainingOutputsMatchTheReference";
    for (const Mutant mutant : entry.must_catch) {
      for (const bool at_production_tolerance : {false, true}) {
        if (at_production_tolerance && !whole_update) continue;
        // Production-side mutants are held to production's bounds already.
        if (at_production_tolerance && is_production_side(mutant)) continue;
        const std::string name = to_string(mutant) +
                                 (at_production_tolerance ? "__at_fp32_bounds" : "") +
                                 "__caught_by__" + entry.name;
        register_check(suite, name, [name = entry.name, mutant, cases, at_production_tolerance,
                                     seed = seed++] {
          if (is_precision_side(mutant) && !statistical_bounds_enabled()) {
            GTEST_SKIP() << "TANDEM_EQUIVALENCE_BOUNDS=rigorous: only the statistical bounds catch "
                         << to_string(mutant);
          }
          const PropertyEntry& property = equivalence::property(name);
          CheckOptions options;
          options.cases = cases;
          options.seed = seed;
          options.shrink = property.name == "AdamwElementMatchesSpec7OnEveryIeeeInput";
          options.quiet_listener = true;
          std::cout << "negative control: the mutant " << to_string(mutant)
                    << " must be rejected\n";
          const CheckOutcome outcome = check_property(
              property, mutant_twin(mutant, at_production_tolerance), options, std::cout);
          EXPECT_TRUE(outcome.failed)
              << "the harness did not catch the mutant " << to_string(mutant) << " with "
              << property.name << " in " << outcome.cases_run << " cases (seed " << outcome.seed
              << "): a hole in the harness";
          if (outcome.failed) std::cout << "caught after " << outcome.cases_run << " case(s)\n";
        });
      }
    }
  }
}

}  // namespace tandem::equivalence
