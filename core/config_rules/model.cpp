// The architecture's rules (SPEC 4): Megatron's choices tandem implements, the sizes, their
// derived defaults (F, G, the padded vocabulary) and what they must fit in.
#include "core/config_rules/rules.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace tandem::config_rules {

namespace {

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

// Names and unsupported Megatron choices: the normalization and the position embedding.
void check_model_choices(const RunArguments& args, Checker& checker) {
  checker.check(args.normalization == "RMSNorm", "--normalization", args.normalization,
                "tandem implements RMSNorm only (SPEC 4)", "use --normalization RMSNorm");
  checker.check(args.position_embedding_type == "rope", "--position-embedding-type",
                args.position_embedding_type, "tandem implements rotary embeddings only (SPEC 4)",
                "use --position-embedding-type rope");
}

// Biases and embedding tying, each given in two spellings.
void resolve_model_flags(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& model = config.model;
  checker.check(!(args.disable_bias_linear && model.add_bias_linear), "--add-bias-linear", "true",
                "contradicts --disable-bias-linear", "give only one of the two");
  checker.check(!(args.untie_embeddings && args.tie_embeddings),
                "--tie-embeddings-and-output-weights", "true",
                "contradicts --untie-embeddings-and-output-weights", "give only one of the two");
  model.tie_embeddings = args.tie_embeddings;
}

// Where Megatron's defaults differ from tandem's: dropout (refused unless 0) and the sequence
// length (a warning).
void check_megatron_model_defaults(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& model = config.model;
  // Dropout: tandem's model has none (SPEC 4). Megatron's default is 0.1 each, so a fragment that
  // does not set them trains with dropout there.
  for (const auto& [value, field] : std::initializer_list<std::pair<double, const char*>>{
           {args.attention_dropout, "--attention-dropout"}, {args.hidden_dropout, "--hidden-dropout"}}) {
    checker.check(value == 0.0, field, text(value), "tandem's model has no dropout (SPEC 4)",
                  "give 0.0 (or drop it)");
  }
  if (!args.given("--attention-dropout") || !args.given("--hidden-dropout")) {
    config.argument_warnings.push_back(
        "dropout: Megatron trains these arguments with --attention-dropout 0.1 and --hidden-dropout 0.1 (its "
        "defaults); tandem's model has none. Add --attention-dropout 0.0 --hidden-dropout 0.0 so that both "
        "train the same model");
  }
  if (!args.given("--seq-length")) {
    config.argument_warnings.push_back("--seq-length not given: tandem's default " + text(model.seq_length) +
                                       " positions (Megatron requires it)");
  }
}

// The architecture's real-valued settings are finite numbers.
void check_model_finite(const RunConfig& config, Checker& checker) {
  auto& model = config.model;
  checker.check_finite({{model.rotary_base, "--rotary-base"},
                        {model.norm_epsilon, "--norm-epsilon"},
                        {model.init_method_std, "--init-method-std"}});
}

// The model's shape: every count at least 1 (the vocabulary's before the tokenizer sets it).
void check_model_counts(const RunConfig& config, Checker& checker) {
  auto& model = config.model;
  checker.check_at_least_one({{model.num_layers, "--num-layers"},
                              {model.hidden_size, "--hidden-size"},
                              {model.num_attention_heads, "--num-attention-heads"},
                              {model.vocab_size, "--vocab-size"}});
}

// The vocabulary's divisor and the sequence length at least 1 (after the tokenizer).
void check_vocabulary_and_sequence_counts(const RunConfig& config, Checker& checker) {
  auto& model = config.model;
  checker.check_at_least_one({{model.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by"},
                              {model.seq_length, "--seq-length"}});
}

// Every size fits before anything uses it: huge values crashed (segfault, SIGFPE) or overflowed
// silently.
void check_model_dimensions(const RunConfig& config, Checker& checker) {
  auto& model = config.model;
  checker.check_dimensions({{model.num_layers, "--num-layers"},
                            {model.hidden_size, "--hidden-size"},
                            {model.ffn_hidden_size, "--ffn-hidden-size"},
                            {model.num_attention_heads, "--num-attention-heads"},
                            {model.num_query_groups, "--num-query-groups"},
                            {model.vocab_size, "--vocab-size"},
                            {model.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by"},
                            {model.seq_length, "--seq-length"}});
}

// Megatron's defaults: F = int(8d/3 / 64) x 64 (at least 64); G = H without --group-query-attention.
void derive_ffn_and_query_groups(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& model = config.model;
  if (!args.given("--ffn-hidden-size")) {
    model.ffn_hidden_size = std::max<std::int64_t>(64, (8 * model.hidden_size / 3) / 64 * 64);
  }
  checker.check_at_least_one({{model.ffn_hidden_size, "--ffn-hidden-size"}});
  if (!args.group_query_attention) {
    checker.check(!args.given("--num-query-groups") ||
                      model.num_query_groups == model.num_attention_heads,
                  "--num-query-groups", text(model.num_query_groups),
                  "takes effect only with --group-query-attention",
                  "add --group-query-attention, or drop --num-query-groups");
    model.num_query_groups = model.num_attention_heads;
  } else if (!args.given("--num-query-groups")) {
    checker.fail("--num-query-groups", "(not given)",
                 "--group-query-attention needs the number of key/value groups",
                 "give --num-query-groups G with H divisible by G");
  }
  checker.check_at_least_one({{model.num_query_groups, "--num-query-groups"}});
}

// Every product of sizes fits: the parameter count and the tokens of an update in 2^53, the
// padded vocabulary in 2^31 - 1.
void check_model_size_fits(const RunConfig& config, Checker& checker) {
  auto& model = config.model;
  auto& parallel = config.parallel;
  auto& batch = config.batch;
  // Products in long double (64-bit mantissa: exact far beyond these limits).
  using Wide = long double;
  const Wide d = static_cast<Wide>(model.hidden_size);
  const Wide heads = static_cast<Wide>(model.num_attention_heads);
  const Wide kv = static_cast<Wide>(model.num_query_groups) * (d / heads);
  const Wide per_layer = 2 * d * d + 2 * d * kv + 3 * d * static_cast<Wide>(model.ffn_hidden_size) + 4 * d;
  const Wide vocabulary = static_cast<Wide>(model.vocab_size) +
                          static_cast<Wide>(model.make_vocab_size_divisible_by) * static_cast<Wide>(parallel.tensor_parallel);
  const Wide parameters = static_cast<Wide>(model.num_layers) * per_layer + 2 * vocabulary * d;
  checker.check(parameters <= static_cast<Wide>(kMaxCount), "--num-layers", text(static_cast<double>(model.num_layers)),
                "with --hidden-size " + text(static_cast<double>(model.hidden_size)) + ", --ffn-hidden-size " +
                    text(static_cast<double>(model.ffn_hidden_size)) + " and the vocabulary gives about " +
                    text(static_cast<double>(parameters)) + " parameters, beyond 2^53",
                "give a realistic model");
  checker.check(vocabulary <= static_cast<Wide>(kMaxDimension), "--make-vocab-size-divisible-by",
                text(static_cast<double>(model.make_vocab_size_divisible_by)),
                "x --tensor-model-parallel-size pads the vocabulary beyond 2^31 - 1 rows",
                "give a divisor such as 128");
  checker.check(static_cast<Wide>(batch.global_batch_size) * static_cast<Wide>(model.seq_length) <= static_cast<Wide>(kMaxCount),
                "--global-batch-size", text(static_cast<double>(batch.global_batch_size)),
                "x --seq-length is beyond 2^53 tokens an update", "give a realistic batch");
}

// The values the layout does not constrain, and the vocabulary padded to a multiple of the
// divisor x TP (Megatron's).
void resolve_model_values(const RunArguments& args, RunConfig& config, Checker& checker) {
  const std::int64_t tp = config.parallel.tensor_parallel;
  auto& model = config.model;
  checker.check(args.max_position_embeddings == 0 ||
                    args.max_position_embeddings >= model.seq_length,
                "--max-position-embeddings", text(args.max_position_embeddings),
                "must be at least --seq-length (" + text(model.seq_length) + ")",
                "raise it or drop it");
  checker.check(model.norm_epsilon > 0.0, "--norm-epsilon", text(model.norm_epsilon),
                "must be > 0", "use 1e-5");
  checker.check(model.rotary_base > 0.0, "--rotary-base", text(model.rotary_base),
                "must be > 0", "use 10000");
  checker.check(model.init_method_std > 0.0, "--init-method-std", text(model.init_method_std),
                "must be > 0", "use 0.02");
  model.padded_vocab_size = round_up(model.vocab_size, model.make_vocab_size_divisible_by * tp);
}

}  // namespace tandem::config_rules
