// The optimizer's rules: AdamW's hyperparameters and the precision (SPEC 6, 7).
#include "core/config_rules/rules.hpp"

namespace tandem::config_rules {

// Megatron's optimizer and precision choices tandem implements.
void check_optimizer_choices(const RunArguments& args, Checker& checker) {
  checker.check(args.optimizer == "adam", "--optimizer", args.optimizer,
                "tandem implements AdamW (Megatron's adam with decoupled decay) only (SPEC 7)",
                "use --optimizer adam");
  checker.check(!args.fp16, "--fp16", "true", "fp16 training is not supported (SPEC 7)",
                "use --bf16, or neither for fp32");
}

// AdamW's real-valued settings are finite numbers.
void check_optimizer_finite(const RunConfig& config, Checker& checker) {
  auto& optimizer = config.optimizer;
  checker.check_finite({{optimizer.adam_beta1, "--adam-beta1"},
                        {optimizer.adam_beta2, "--adam-beta2"},
                        {optimizer.adam_eps, "--adam-eps"},
                        {optimizer.clip_grad, "--clip-grad"}});
}

// AdamW's ranges, and the weight decay's (an optimizer option in Megatron's groups).
void check_optimizer_values(const RunConfig& config, Checker& checker) {
  auto& optimizer = config.optimizer;
  auto& schedule = config.schedule;
  checker.check(optimizer.adam_beta1 >= 0.0 && optimizer.adam_beta1 < 1.0, "--adam-beta1",
                text(optimizer.adam_beta1), "must lie in [0, 1)", "use 0.9");
  checker.check(optimizer.adam_beta2 >= 0.0 && optimizer.adam_beta2 < 1.0, "--adam-beta2",
                text(optimizer.adam_beta2), "must lie in [0, 1)", "use 0.95 or 0.999");
  checker.check(optimizer.adam_eps > 0.0, "--adam-eps", text(optimizer.adam_eps), "must be > 0",
                "use 1e-8");
  checker.check(optimizer.clip_grad >= 0.0, "--clip-grad", text(optimizer.clip_grad),
                "must be >= 0 (0 disables clipping)", "use 1.0 or 0");
  checker.check(schedule.weight_decay >= 0.0, "--weight-decay", text(schedule.weight_decay),
                "must be >= 0", "use 0.1 or 0");
}

}  // namespace tandem::config_rules
