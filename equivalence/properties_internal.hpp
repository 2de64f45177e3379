// What the harness's property files share (properties.cpp, properties_<family>.cpp), not part of
// the harness's interface: each property's body, which the registry names (properties.cpp), and
// the case handling every body uses (properties_cases.cpp).
#pragma once

#include <cstdint>

#include "core/config.hpp"
#include "equivalence/comparison.hpp"
#include "equivalence/generators.hpp"
#include "equivalence/properties.hpp"
#include "equivalence/tolerance.hpp"
#include "equivalence/twin.hpp"

namespace tandem::equivalence {

// ---- the case handling (properties_cases.cpp; assert_report in properties.cpp) ----

// Asserts the report's verdict, agreed over ranks, with the report as the diagnosis; tallies its
// sharpness (under the precisions compared, when given).
void assert_report(const Report& report, const PrecisionPair* precisions = nullptr);

// The case as `kind` can run it, mapped into its domain rather than filtered.
void adapt_to(const TwinKind& kind, UpdateCase& c);

// The twin's setup for `config`, its injection counted from the case's first update.
TwinSetup setup_for(const RunConfig& config, const reference::SampleProvider& samples,
                    const Injection& injection, std::int64_t start_samples);

// The counters of a run that has made `samples / GBS` successful updates.
void move_to_position(Twin& twin, std::int64_t samples, std::int64_t gbs);

// SPEC 6: the clip threshold of the case's ClipMode, placed against the reference's norm.
double clip_for(const UpdateCase& c, const RunConfig& config,
                const reference::SampleProvider& samples, const PrecisionPair& precisions);

// ---- the properties, each drawing its case (the registry's bodies) ----

// properties_updates.cpp
void updates_match_the_reference(const TwinKind& kind);
void training_outputs_match_the_reference(const TwinKind& kind);
void accumulated_microbatches_equal_the_direct_global_batch(const TwinKind& kind);
void the_clip_decision_holds_within_1e7_of_its_threshold(const TwinKind& kind);
// properties_skip_and_resume.cpp
void a_skipped_update_changes_only_the_counters_it_names(const TwinKind& kind);
void save_stop_resume_equals_running_straight(const TwinKind& kind);
// properties_normalization.cpp
void microbatch_mean_differs_exactly_when_loss_token_counts_differ(const TwinKind& kind);
// properties_adamw.cpp
void adamw_element_matches_spec7_on_every_ieee_input(const TwinKind& kind);

}  // namespace tandem::equivalence
