// Megatron-style command-line arguments (SPEC 10) and `--config run.json`, turned into a validated
// RunConfig. Every subcommand that takes a run's configuration (plan, schedule, train, check) binds
// the same options through add_run_options, so a Megatron fragment parses identically everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/config.hpp"
#include "core/config_issue.hpp"

namespace tandem {

// Parses "10T", "20B", "1.5M", "4096" into a token count (K=1e3, M=1e6, B=G=1e9, T=1e12).
// Returns nullopt on anything else.
std::optional<double> parse_token_count(const std::string& text);

// The raw values as the user gave them, before defaults that depend on other fields.
// Option objects remember whether a value was given (count() > 0).
struct RunArguments {
  RunConfig values;  // bound directly where the option maps one-to-one onto a field

  // Text-valued options, checked in build_run_config.
  std::string normalization = "RMSNorm";
  std::string position_embedding_type = "rope";
  std::string optimizer = "adam";
  std::string lr_decay_style = "linear";
  std::string weight_decay_incr_style = "constant";
  std::string loss_normalization = "per-token";
  std::string data_order = "shuffled";
  std::string packing = "concat";
  std::string train_tokens;
  std::string lr_warmup_tokens;
  std::vector<std::string> data_paths;
  std::string tokenizer_type;  // --tokenizer-type; empty = not given (the byte tokenizer)
  std::int64_t null_tokenizer_eod_id = 0;   // --null-tokenizer-eod-id (when given)
  std::int64_t null_tokenizer_pad_id = -1;  // --null-tokenizer-pad-id
  std::string recompute_granularity;  // --recompute-granularity; empty = not given (none)
  std::string recompute_method;       // --recompute-method; empty = not given
  std::int64_t recompute_num_layers = 0;  // --recompute-num-layers; 0 = not given
  bool recompute_activations = false;     // --recompute-activations: Megatron's alias of selective

  // Values whose default depends on other fields, or that exist in two spellings.
  std::int64_t train_iters = 0;
  std::int64_t lr_warmup_iters = 0;
  std::int64_t lr_decay_iters = 0;
  double lr_warmup_fraction = 0.0;
  std::int64_t num_layers_per_virtual_stage = 0;
  std::int64_t num_virtual_stages_per_pipeline_rank = 0;
  std::int64_t max_position_embeddings = 0;
  std::int64_t data_parallel_size = 0;
  bool fp16 = false;
  bool group_query_attention = false;
  bool swiglu = false;
  bool disable_bias_linear = false;
  bool untie_embeddings = false;
  bool tie_embeddings = false;
  bool calculate_per_token_loss = false;

  // Megatron's dropout options: tandem's model has no dropout, so only 0 is accepted.
  double attention_dropout = 0.0;
  double hidden_dropout = 0.0;
  std::string config_path;  // --config FILE.json (applied by build_run_config)
  CLI::App* app = nullptr;  // the (sub)command these were bound to
  bool given(const std::string& long_name) const;  // "--seq-length" -> was it given?
};

// Range validators whose messages say the rule ("must be at least 1", "must be >= 0"), where
// CLI11's PositiveNumber printed a 309-digit range; for finite numbers.
CLI::Validator at_least_one();
CLI::Validator non_negative();
CLI::Validator positive_number();  // > 0

// Binds every run option (Megatron's names, tandem's own, and --config FILE.json) on `app`.
void add_run_options(CLI::App& app, RunArguments& args);

// Where the world size comes from when training (the launcher) rather than planning.
struct LaunchContext {
  std::optional<std::int64_t> launched_world_size;  // ranks the launcher started; none = planning
  // `tandem train --train-samples 0 --save DIR` writes the initialized model (SPEC 12).
  bool allow_zero_train_samples = false;
  // False for a command that never reads the architecture (tandem schedule): the architecture's
  // defaults are then not held to the parallel layout's rules, only what the user gave.
  bool needs_architecture = true;
};

// Applies derived defaults (Megatron's), converts iterations and tokens into samples, and checks
// every rule. Throws ConfigError listing every broken rule.
RunConfig build_run_config(const RunArguments& args, const LaunchContext& launch = {});

// Runs `app.parse(argc, argv)` and turns CLI11 and ConfigError failures into a clear message on
// stderr and the exit code (2 for bad input). Returns nullopt when the program should go on.
std::optional<int> parse_or_exit_code(CLI::App& app, int argc, const char* const* argv);

}  // namespace tandem
