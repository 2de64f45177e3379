// The schedule's rules (SPEC 8, 11): the decay and weight-decay styles, the learning rates, and the
// spans in samples, iterations or tokens, converted to samples and rounded to whole updates.
#include "core/config_rules/rules.hpp"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace tandem::config_rules {

namespace {

// The spans are given in iterations (updates), converted to samples by the global batch.
bool iteration_based(const RunArguments& args) {
  return args.given("--train-iters") || args.given("--lr-warmup-iters") || args.given("--lr-decay-iters");
}

}  // namespace

// The learning rate's decay style and the weight decay's increment style onto their enums.
void resolve_schedule_styles(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& schedule = config.schedule;
  checker.choose("--lr-decay-style", args.lr_decay_style,
                 {{"linear", LrDecayStyle::linear}, {"cosine", LrDecayStyle::cosine},
                  {"constant", LrDecayStyle::constant}},
                 schedule.lr_decay_style, "tandem supports linear, cosine and constant (SPEC 8)",
                 "use one of linear, cosine, constant");
  checker.choose("--weight-decay-incr-style", args.weight_decay_incr_style,
                 {{"constant", WeightDecayIncrStyle::constant}, {"linear", WeightDecayIncrStyle::linear},
                  {"cosine", WeightDecayIncrStyle::cosine}},
                 schedule.weight_decay_incr_style, "must be constant, linear or cosine (Megatron)",
                 "use one of those three");
}

// The schedule's real-valued settings are finite numbers.
void check_schedule_finite(const RunConfig& config, Checker& checker) {
  auto& schedule = config.schedule;
  checker.check_finite({{schedule.lr, "--lr"},
                        {schedule.min_lr, "--min-lr"},
                        {schedule.lr_warmup_init, "--lr-warmup-init"},
                        {schedule.weight_decay, "--weight-decay"},
                        {schedule.start_weight_decay, "--start-weight-decay"},
                        {schedule.end_weight_decay, "--end-weight-decay"}});
}

// Learning rate values.
void check_learning_rates(const RunConfig& config, Checker& checker) {
  auto& schedule = config.schedule;
  checker.check(schedule.lr > 0.0, "--lr", text(schedule.lr), "must be > 0",
                "give the peak learning rate");
  checker.check(schedule.min_lr >= 0.0 && schedule.min_lr <= schedule.lr, "--min-lr",
                text(schedule.min_lr), "must satisfy 0 <= min-lr <= lr (" + text(schedule.lr) + ")",
                "lower --min-lr or raise --lr");
  checker.check(schedule.lr_warmup_init >= 0.0 && schedule.lr_warmup_init <= schedule.lr,
                "--lr-warmup-init", text(schedule.lr_warmup_init),
                "must satisfy 0 <= lr-warmup-init <= lr", "use 0");
}

// Schedule spans: samples, iterations or tokens, never mixed (Megatron asserts the same).
void check_span_units(const RunArguments& args, Checker& checker) {
  const bool sample_based = args.given("--train-samples") || args.given("--lr-warmup-samples") ||
                            args.given("--lr-decay-samples");
  const bool iterations = iteration_based(args);
  if (sample_based && iterations) {
    checker.fail("--train-iters/--lr-*-iters", "given",
                 "sample-based and iteration-based schedule options must not be mixed",
                 "give the spans all in samples or all in iterations");
  }
  checker.check(!(args.given("--lr-warmup-tokens") && args.given("--lr-warmup-fraction")),
                "--lr-warmup-tokens", args.lr_warmup_tokens,
                "gives the warmup a second time (with --lr-warmup-fraction)",
                "drop one of the two");
  checker.check(!(args.given("--lr-warmup-fraction") &&
                  (args.given("--lr-warmup-samples") || args.given("--lr-warmup-iters"))),
                "--lr-warmup-fraction", text(args.lr_warmup_fraction),
                "gives the warmup a second time (Megatron asserts the same)",
                "give one warmup option");
}

// Iterations x the global batch, within 2^53 samples.
void convert_iterations(const RunArguments& args, RunConfig& config, Checker& checker) {
  const std::int64_t gbs = config.batch.global_batch_size;
  auto& schedule = config.schedule;
  if (!iteration_based(args)) return;
  for (const auto& [iterations, field] : std::initializer_list<std::pair<std::int64_t, const char*>>{
           {args.train_iters, "--train-iters"}, {args.lr_warmup_iters, "--lr-warmup-iters"},
           {args.lr_decay_iters, "--lr-decay-iters"}}) {
    checker.check(iterations <= (std::int64_t{1} << 53) / gbs, field, text(static_cast<double>(iterations)),
                  "x --global-batch-size (" + text(gbs) + ") is beyond 2^53 samples",
                  "give a realistic number of updates");
  }
  checker.throw_if_any();
  schedule.train_samples = args.train_iters * gbs;
  schedule.lr_warmup_samples = args.lr_warmup_iters * gbs;
  schedule.lr_decay_samples = args.lr_decay_iters * gbs;
}

// Every span within 2^53 samples: the schedule counts them exactly in double.
void check_sample_counts(const RunConfig& config, Checker& checker) {
  auto& schedule = config.schedule;
  for (const auto& [samples, field] : std::initializer_list<std::pair<std::int64_t, const char*>>{
           {schedule.train_samples, "--train-samples"}, {schedule.lr_warmup_samples, "--lr-warmup-samples"},
           {schedule.lr_decay_samples, "--lr-decay-samples"}}) {
    checker.check(samples <= (std::int64_t{1} << 53), field, text(static_cast<double>(samples)),
                  "is beyond 2^53 samples (the schedule counts them exactly in double)",
                  "give a realistic count");
  }
}

// Token budgets (--train-tokens, --lr-warmup-tokens) to whole updates of GBS x seq tokens.
void apply_token_budgets(const RunArguments& args, RunConfig& config, Checker& checker) {
  const std::int64_t gbs = config.batch.global_batch_size;
  const std::int64_t tokens_per_update = gbs * config.model.seq_length;
  auto& schedule = config.schedule;
  if (args.given("--train-tokens")) {
    const auto tokens = parse_token_count(args.train_tokens);
    if (!tokens) {
      checker.fail("--train-tokens", args.train_tokens, "must be a positive count such as 10T",
                   "write digits with an optional K, M, B or T suffix");
    } else {
      config.token_rounding.requested_train_tokens = *tokens;
      // Budget rounds down to whole updates (SPEC 11). Given beside --train-samples (a pasted
      // Megatron fragment plus the budget it came from), the two must agree.
      const auto updates = static_cast<std::int64_t>(std::floor(*tokens / tokens_per_update));
      const bool also_given = args.given("--train-samples") || args.given("--train-iters");
      checker.check(!also_given || schedule.train_samples == updates * gbs, "--train-tokens",
                    args.train_tokens,
                    "rounds down to " + text(updates * gbs) + " samples (" + text(updates) +
                        " updates), but --train-samples/--train-iters give " +
                        text(schedule.train_samples) + " samples",
                    "drop one of the two, or make them agree");
      schedule.train_samples = updates * gbs;
    }
  }
  if (args.given("--lr-warmup-tokens")) {
    const auto tokens = parse_token_count(args.lr_warmup_tokens);
    if (!tokens) {
      checker.fail("--lr-warmup-tokens", args.lr_warmup_tokens,
                   "must be a positive count such as 20B",
                   "write digits with an optional K, M, B or T suffix");
    } else {
      config.token_rounding.requested_lr_warmup_tokens = *tokens;
      // Warmup rounds up to whole updates (SPEC 11); beside a sample/iteration warmup, they agree.
      const auto updates = static_cast<std::int64_t>(std::ceil(*tokens / tokens_per_update));
      const bool also_given = args.given("--lr-warmup-samples") || args.given("--lr-warmup-iters");
      checker.check(!also_given || schedule.lr_warmup_samples == updates * gbs,
                    "--lr-warmup-tokens", args.lr_warmup_tokens,
                    "rounds up to " + text(updates * gbs) + " samples (" + text(updates) +
                        " updates), but --lr-warmup-samples/--lr-warmup-iters give " +
                        text(schedule.lr_warmup_samples) + " samples",
                    "drop one of the two, or make them agree");
      schedule.lr_warmup_samples = updates * gbs;
    }
  }
}

// Megatron's defaults for the decay span and the warmup fraction, and the spans' own rules.
void derive_spans(const RunArguments& args, const LaunchContext& launch, RunConfig& config, Checker& checker) {
  const std::int64_t gbs = config.batch.global_batch_size;
  auto& schedule = config.schedule;
  const bool decay_given = args.given("--lr-decay-samples") || args.given("--lr-decay-iters");
  if (!decay_given) schedule.lr_decay_samples = schedule.train_samples;  // Megatron's default
  if (args.given("--lr-warmup-fraction")) {
    checker.check(args.lr_warmup_fraction >= 0.0 && args.lr_warmup_fraction <= 1.0,
                  "--lr-warmup-fraction", text(args.lr_warmup_fraction), "must lie in [0, 1]",
                  "use a fraction such as 0.01");
    schedule.lr_warmup_samples =
        static_cast<std::int64_t>(args.lr_warmup_fraction * schedule.lr_decay_samples);
  }
  const bool initialization_only = launch.allow_zero_train_samples &&
                                   args.given("--train-samples") && schedule.train_samples == 0;
  checker.check(schedule.train_samples >= gbs || initialization_only, "--train-samples",
                text(schedule.train_samples),
                "must be at least one global batch (" + text(gbs) + " samples)",
                "give --train-samples (or --train-iters, or --train-tokens) of at least one "
                "update");
  checker.check(schedule.lr_warmup_samples >= 0, "--lr-warmup-samples",
                text(schedule.lr_warmup_samples), "must be >= 0", "use 0 for no warmup");
  checker.check(schedule.lr_decay_samples >= 0, "--lr-decay-samples",
                text(schedule.lr_decay_samples), "must be >= 0", "drop it to decay over training");
  // Megatron's OptimizerParamScheduler asserts lr_decay_steps > 0 and warmup < decay, whatever
  // the decay style.
  checker.check(schedule.lr_warmup_samples < schedule.lr_decay_samples || initialization_only,
                "--lr-warmup-samples", text(schedule.lr_warmup_samples),
                "the warmup must end before the decay span does (" + text(schedule.lr_decay_samples) +
                    " samples; Megatron asserts warmup < decay)",
                "shorten the warmup or lengthen --lr-decay-samples");
}

// The weight decay increment over training (Megatron: constant forbids start/end; the others need both).
void resolve_weight_decay_schedule(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& schedule = config.schedule;
  schedule.wd_incr_samples = schedule.train_samples;
  if (schedule.weight_decay_incr_style == WeightDecayIncrStyle::constant) {
    checker.check(!args.given("--start-weight-decay") && !args.given("--end-weight-decay"),
                  "--start-weight-decay/--end-weight-decay", "given",
                  "take effect only with --weight-decay-incr-style linear or cosine (Megatron)",
                  "drop them, or choose an increment style");
    schedule.start_weight_decay = schedule.weight_decay;
    schedule.end_weight_decay = schedule.weight_decay;
  } else {
    checker.check(args.given("--start-weight-decay") && args.given("--end-weight-decay"),
                  "--weight-decay-incr-style", args.weight_decay_incr_style,
                  "needs both --start-weight-decay and --end-weight-decay (Megatron)",
                  "give both");
    checker.check(schedule.start_weight_decay >= 0.0 && schedule.end_weight_decay >= 0.0,
                  "--start-weight-decay/--end-weight-decay",
                  text(schedule.start_weight_decay) + "/" + text(schedule.end_weight_decay),
                  "must be >= 0", "give non-negative values");
    checker.check(schedule.end_weight_decay >= schedule.start_weight_decay, "--end-weight-decay",
                  text(schedule.end_weight_decay),
                  "must be >= --start-weight-decay (" + text(schedule.start_weight_decay) +
                      "): the weight decay only increases (Megatron asserts end_wd >= start_wd)",
                  "swap them, or use --weight-decay-incr-style constant");
  }
}

}  // namespace tandem::config_rules
