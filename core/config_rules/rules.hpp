// The rules of each component of a run's configuration, one file per component (model.cpp,
// parallel.cpp, data.cpp, recompute.cpp, optimizer.cpp, schedule.cpp, checkpoint.cpp,
// evaluation.cpp), composed by build_run_config (core/args.cpp). Each function appends the rules
// its component's values break to a Checker, and the `resolve_` and `derive_` ones also complete
// the values Megatron derives. Internal to core/args.cpp: the composition's order is the order in
// which the issues are reported, and its Checker::throw_if_any barriers keep a later rule from
// reading a value an earlier one refused.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/args.hpp"
#include "core/config.hpp"
#include "core/config_issue.hpp"

namespace tandem::config_rules {

// A dimension fits in 2^31 - 1 (kernels index with it; MPI counts are int); a count (parameters,
// the tokens of an update, samples) fits in 2^53 (exact in the schedule's double arithmetic).
inline constexpr std::int64_t kMaxDimension = 2147483647;
inline constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;

// A value as an issue prints it: 17 significant digits for a real, all digits for a count.
std::string text(double value);
std::string text(std::int64_t value);

// Collects broken rules; `check(condition, ...)` records one when the condition is false.
class Checker {
 public:
  void fail(std::string field, std::string value, std::string rule, std::string fix) {
    issues_.push_back({std::move(field), std::move(value), std::move(rule), std::move(fix)});
  }
  void check(bool ok, std::string field, std::string value, std::string rule, std::string fix) {
    if (!ok) fail(std::move(field), std::move(value), std::move(rule), std::move(fix));
  }
  // The table rules every count, size and real setting is held to, in the table's order.
  using Counts = std::vector<std::pair<std::int64_t, const char*>>;  // value, option
  using Reals = std::vector<std::pair<double, const char*>>;
  void check_at_least_one(const Counts& counts);
  void check_dimensions(const Counts& sizes);  // each <= kMaxDimension
  void check_finite(const Reals& reals);
  // A text option onto its enum: `choices` pairs each accepted spelling with its value; any other
  // spelling breaks `rule`.
  template <typename Enum>
  void choose(const char* field, const std::string& given, std::initializer_list<std::pair<const char*, Enum>> choices,
              Enum& chosen, std::string rule, std::string fix) {
    for (const auto& [spelling, value] : choices) {
      if (given == spelling) {
        chosen = value;
        return;
      }
    }
    fail(field, given, std::move(rule), std::move(fix));
  }
  void throw_if_any() const {
    if (!issues_.empty()) throw ConfigError(issues_);
  }

 private:
  std::vector<ConfigIssue> issues_;
};

// " (the default: not given)" for an option the user never wrote: a rule broken by a default
// says so.
std::string default_note(const RunArguments& args, const char* option);

// model.cpp: the architecture (SPEC 4).
void check_model_choices(const RunArguments& args, Checker& checker);
void resolve_model_flags(const RunArguments& args, RunConfig& config, Checker& checker);
void check_megatron_model_defaults(const RunArguments& args, RunConfig& config, Checker& checker);
void check_model_finite(const RunConfig& config, Checker& checker);
void check_model_counts(const RunConfig& config, Checker& checker);
void check_vocabulary_and_sequence_counts(const RunConfig& config, Checker& checker);
void check_model_dimensions(const RunConfig& config, Checker& checker);
void derive_ffn_and_query_groups(const RunArguments& args, RunConfig& config, Checker& checker);
void check_model_size_fits(const RunConfig& config, Checker& checker);
void resolve_model_values(const RunArguments& args, RunConfig& config, Checker& checker);

// parallel.cpp: the parallel layout and the batch (Megatron's arguments.py).
void check_layout_counts(const RunConfig& config, Checker& checker);
void check_layout_dimensions(const RunConfig& config, Checker& checker);
void check_architecture_against_layout(const RunArguments& args, const LaunchContext& launch,
                                       const RunConfig& config, Checker& checker);
void resolve_parallel_options(const RunArguments& args, RunConfig& config, Checker& checker);
void resolve_pipeline_split(const RunArguments& args, const LaunchContext& launch, RunConfig& config,
                            Checker& checker);
void resolve_world_size(const RunArguments& args, const LaunchContext& launch, RunConfig& config,
                        Checker& checker);
void check_global_batch(const RunConfig& config, Checker& checker);

// data.cpp: the data, its packing and loss, and the tokenizer (SPEC 2, 3, 5, 13).
void resolve_data_choices(const RunArguments& args, RunConfig& config, Checker& checker);
void check_split(const RunConfig& config);
void resolve_tokenizer(const RunArguments& args, RunConfig& config, Checker& checker);

// recompute.cpp: activation recomputation (Megatron's TransformerConfig).
void resolve_recompute(const RunArguments& args, RunConfig& config, Checker& checker);

// optimizer.cpp: AdamW and the precision (SPEC 6, 7).
void check_optimizer_choices(const RunArguments& args, Checker& checker);
void check_optimizer_finite(const RunConfig& config, Checker& checker);
void check_optimizer_values(const RunConfig& config, Checker& checker);

// schedule.cpp: the learning-rate and weight-decay schedule and its spans (SPEC 8, 11).
void resolve_schedule_styles(const RunArguments& args, RunConfig& config, Checker& checker);
void check_schedule_finite(const RunConfig& config, Checker& checker);
void check_learning_rates(const RunConfig& config, Checker& checker);
void check_span_units(const RunArguments& args, Checker& checker);
void convert_iterations(const RunArguments& args, RunConfig& config, Checker& checker);
void check_sample_counts(const RunConfig& config, Checker& checker);
void apply_token_budgets(const RunArguments& args, RunConfig& config, Checker& checker);
void derive_spans(const RunArguments& args, const LaunchContext& launch, RunConfig& config, Checker& checker);
void resolve_weight_decay_schedule(const RunArguments& args, RunConfig& config, Checker& checker);

// checkpoint.cpp: --save, --load and the save interval (SPEC 9).
void check_checkpoint_directories(const RunConfig& config, Checker& checker);
void check_save_interval(const RunConfig& config, Checker& checker);

// evaluation.cpp: Megatron's --eval-interval and --eval-iters (docs/DATA.md section 12).
void resolve_evaluation(const RunArguments& args, RunConfig& config, Checker& checker);

}  // namespace tandem::config_rules
