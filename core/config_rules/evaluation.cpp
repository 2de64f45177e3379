// Evaluation's rules (Megatron's --eval-interval, --eval-iters; docs/DATA.md section 12).
#include "core/config_rules/rules.hpp"

#include <string>

#include "core/data/split.hpp"

namespace tandem::config_rules {

// Evaluation runs only with a validation part in --split; without one, eval_iters is 0.
void resolve_evaluation(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& evaluation = config.evaluation;
  checker.check(evaluation.eval_interval >= 0, "--eval-interval", text(evaluation.eval_interval),
                "must be >= 0", "use 0 to evaluate only at the end of training");
  checker.check(evaluation.eval_iters >= 0, "--eval-iters", text(evaluation.eval_iters),
                "must be >= 0", "use 0 for no evaluation");
  checker.throw_if_any();
  const bool has_validation_split =
      !config.data.split.empty() && data::parse_split_weights(config.data.split)[1] > 0.0;
  if (!has_validation_split) {
    const std::string why = config.data.split.empty()
                                ? "without --split every sequence trains, so there is no "
                                  "validation split to evaluate"
                                : "--split " + config.data.split +
                                      " gives the validation split (its second part) weight 0";
    const std::string fix = "give the validation part a weight, e.g. --split 969,30,1, or drop it";
    checker.check(!(args.given("--eval-iters") && evaluation.eval_iters > 0), "--eval-iters",
                  text(evaluation.eval_iters), "asks for evaluation, but " + why, fix);
    checker.check(!(args.given("--eval-interval") && evaluation.eval_interval > 0),
                  "--eval-interval", text(evaluation.eval_interval),
                  "asks for evaluation, but " + why, fix);
    checker.throw_if_any();
    evaluation.eval_iters = 0;  // nothing to evaluate: Megatron's do_valid is false
  }
  if (!evaluation.evaluates()) evaluation.eval_interval = 0;
}

}  // namespace tandem::config_rules
