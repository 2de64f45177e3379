// Activation recomputation's rules (Megatron's --recompute-granularity, --recompute-method and
// --recompute-num-layers; no result changes a bit).
#include "core/config_rules/rules.hpp"

#include <string>

namespace tandem::config_rules {

// Megatron's recompute rules (TransformerConfig.__post_init__; --recompute-activations sets
// selective in its arguments.py). A method given without a granularity is ignored, as there.
void resolve_recompute(const RunArguments& args, RunConfig& config, Checker& checker) {
  RecomputeConfig& recompute = config.recompute;
  const std::string granularity_text =
      args.recompute_activations && args.recompute_granularity.empty() ? "selective" : args.recompute_granularity;
  if (!granularity_text.empty()) {
    if (const auto granularity = parse_recompute_granularity(granularity_text)) {
      recompute.granularity = *granularity;
    } else {
      checker.fail("--recompute-granularity", granularity_text, "must be none, selective or full (Megatron's)",
                   "use one of none, selective, full");
    }
  }
  checker.check(!args.recompute_activations || recompute.granularity == RecomputeGranularity::selective,
                "--recompute-activations", "true", "means --recompute-granularity selective (Megatron)",
                "give --recompute-activations or --recompute-granularity " + granularity_text + ", not both");
  if (!args.recompute_method.empty()) {
    if (const auto method = parse_recompute_method(args.recompute_method)) {
      recompute.method = *method;
    } else {
      checker.fail("--recompute-method", args.recompute_method, "must be uniform or block (Megatron's)",
                   "use uniform or block");
    }
  }
  if (recompute.granularity == RecomputeGranularity::full) {
    checker.check(!args.recompute_method.empty(), "--recompute-method", "(not given)",
                  "must be uniform or block with --recompute-granularity full (Megatron)",
                  "add --recompute-method uniform (or block)");
    checker.check(args.recompute_num_layers > 0, "--recompute-num-layers", "(not given)",
                  "must be at least 1 with --recompute-granularity full (Megatron: between 1 and the layers "
                  "per pipeline rank)",
                  "add --recompute-num-layers 1 (uniform: layers per recomputed group)");
    recompute.num_layers = args.recompute_num_layers;
  } else {
    checker.check(args.recompute_num_layers == 0 || recompute.granularity == RecomputeGranularity::none,
                  "--recompute-num-layers", text(args.recompute_num_layers),
                  "must not be given with --recompute-granularity selective (Megatron)",
                  "drop --recompute-num-layers, or use --recompute-granularity full");
    if (recompute.granularity == RecomputeGranularity::none &&
        (!args.recompute_method.empty() || args.recompute_num_layers > 0)) {
      config.argument_warnings.push_back(
          "--recompute-method/--recompute-num-layers without --recompute-granularity full: nothing is recomputed "
          "(Megatron ignores them too)");
    }
  }
}

}  // namespace tandem::config_rules
