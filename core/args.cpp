// Megatron-style arguments -> RunConfig: option binding, the JSON config file, and the composition
// of every component's rules (core/config_rules/: derived defaults and validation; SPEC 10, 12).
#include "core/args.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/config_rules/rules.hpp"

namespace tandem {
namespace {

// `--config FILE.json`: one object whose keys are long option names without the dashes
// ("micro-batch-size" or "micro_batch_size"); numbers, strings, booleans (flags) and arrays. Each
// key the command line did not give is applied to its option as if given there (the command line
// overrides the file). Every failure is a ConfigError naming the file, the key and the fix.
void apply_config_file(const RunArguments& args) {
  if (args.config_path.empty() || args.app == nullptr) return;
  const std::string& path = args.config_path;
  const auto fail = [&path](const std::string& rule, const std::string& fix) {
    throw ConfigError({ConfigIssue{"--config", path, rule, fix}});
  };
  std::ifstream input(path);
  if (!input) fail("cannot be opened", "give the path of an existing JSON file");
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(input);
  } catch (const nlohmann::json::parse_error& error) {
    fail("is not valid JSON (" + std::string(error.what()) + ")", "write one JSON object of option names to values");
  }
  if (!document.is_object()) fail("must hold one JSON object", "write {\"micro-batch-size\": 1, ...}");
  for (const auto& item : document.items()) {
    // Named copies, not a structured binding: clang 14 (the fuzz build) cannot capture a binding.
    const std::string key = item.key();
    const nlohmann::json& value = item.value();
    std::string name = key;
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    CLI::Option* option = name == "config" ? nullptr : args.app->get_option_no_throw("--" + name);
    if (option == nullptr) {
      fail("key \"" + key + "\" is not an option of `tandem " + args.app->get_name() + "`",
           "remove it, or spell an option's long name without the dashes");
    }
    if (option->count() > 0) continue;  // the command line overrides the file
    std::vector<std::string> inputs;
    const auto text_of = [&](const nlohmann::json& element) {
      if (element.is_string()) return element.get<std::string>();
      if (element.is_boolean()) return std::string(element.get<bool>() ? "true" : "false");
      if (element.is_number()) return element.dump();
      fail("key \"" + key + "\" holds " + element.dump(), "give a number, string, boolean or array");
      return std::string();
    };
    if (value.is_array()) {
      for (const auto& element : value) inputs.push_back(text_of(element));
    } else {
      inputs.push_back(text_of(value));
    }
    try {
      option->add_result(inputs);
      option->run_callback();
    } catch (const CLI::Error& error) {
      fail("key \"" + key + "\" = " + value.dump() + ": " + error.what(),
           "give a value " + option->get_name() + " takes on the command line");
    }
  }
}

}  // namespace

std::optional<double> parse_token_count(const std::string& input) {
  if (input.empty()) return std::nullopt;
  double multiplier = 1.0;
  std::string digits = input;
  switch (input.back()) {
    case 'K': case 'k': multiplier = 1e3; break;
    case 'M': case 'm': multiplier = 1e6; break;
    case 'B': case 'b': case 'G': case 'g': multiplier = 1e9; break;
    case 'T': case 't': multiplier = 1e12; break;
    default: break;
  }
  if (multiplier != 1.0) digits.pop_back();
  if (digits.empty()) return std::nullopt;
  std::size_t consumed = 0;
  double value = 0.0;
  try {
    value = std::stod(digits, &consumed);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (consumed != digits.size() || !std::isfinite(value) || value <= 0.0) return std::nullopt;
  return value * multiplier;
}

namespace {

CLI::Validator number_at_least(double minimum, bool strictly, const std::string& rule) {
  return CLI::Validator(
      [minimum, strictly, rule](std::string& input) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(input.c_str(), &end);
        if (end == input.c_str() || *end != '\0' || !std::isfinite(value)) return input + " is not a finite number";
        const bool within = strictly ? value > minimum : value >= minimum;
        return within ? std::string() : input + " " + rule;
      },
      rule, "at least");
}

}  // namespace

CLI::Validator at_least_one() { return number_at_least(1.0, false, "must be at least 1"); }
CLI::Validator non_negative() { return number_at_least(0.0, false, "must be >= 0"); }
CLI::Validator positive_number() { return number_at_least(0.0, true, "must be > 0"); }

bool RunArguments::given(const std::string& long_name) const {
  const CLI::Option* option = app->get_option_no_throw(long_name);
  return option != nullptr && option->count() > 0;
}

namespace {

// The model options.
void add_model_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string model = "Model (SPEC 4)";
  app.add_option("--num-layers", v.model.num_layers, "decoder blocks L")
      ->capture_default_str()->group(model);
  app.add_option("--hidden-size", v.model.hidden_size, "model width d")
      ->capture_default_str()->group(model);
  app.add_option("--ffn-hidden-size", v.model.ffn_hidden_size,
                 "SwiGLU hidden size F (default: Megatron's int(8d/3 / 64) x 64, at least 64)")
      ->group(model);
  app.add_option("--num-attention-heads", v.model.num_attention_heads, "query heads H")
      ->capture_default_str()->group(model);
  app.add_option("--num-query-groups", v.model.num_query_groups,
                 "key/value groups G with --group-query-attention (default: H)")
      ->group(model);
  app.add_flag("--group-query-attention", args.group_query_attention,
               "use --num-query-groups key/value groups")->group(model);
  app.add_option("--vocab-size", v.model.vocab_size,
                 "tokenizer vocabulary before padding (tokens; byte tokenizer: 258)")
      ->capture_default_str()->group(model);
  app.add_option("--make-vocab-size-divisible-by", v.model.make_vocab_size_divisible_by,
                 "pad the vocabulary to a multiple of this x TP")
      ->capture_default_str()->group(model);
  app.add_option("--seq-length", v.model.seq_length, "input positions per sample (tokens)")
      ->capture_default_str()->group(model);
  app.add_option("--attention-dropout", args.attention_dropout,
                 "Megatron's attention dropout: tandem's model has none, so only 0 is accepted "
                 "(Megatron's default is 0.1)")
      ->group(model);
  app.add_option("--hidden-dropout", args.hidden_dropout,
                 "Megatron's hidden dropout: tandem's model has none, so only 0 is accepted "
                 "(Megatron's default is 0.1)")
      ->group(model);
  app.add_option("--max-position-embeddings", args.max_position_embeddings,
                 "accepted for Megatron; must be >= --seq-length when given")->group(model);
  app.add_flag("--swiglu", args.swiglu, "accepted for Megatron; tandem's MLP is always SwiGLU")
      ->group(model);
  app.add_option("--normalization", args.normalization, "RMSNorm (the only one supported)")
      ->capture_default_str()->group(model);
  app.add_option("--position-embedding-type", args.position_embedding_type,
                 "rope (the only one supported)")->capture_default_str()->group(model);
  app.add_flag("--disable-bias-linear", args.disable_bias_linear,
               "no biases in linear layers (the default)")->group(model);
  app.add_flag("--add-bias-linear", v.model.add_bias_linear, "biases in linear layers")
      ->group(model);
  app.add_flag("--untie-embeddings-and-output-weights", args.untie_embeddings,
               "separate embedding and output matrices (tandem's default)")->group(model);
  app.add_flag("--tie-embeddings-and-output-weights", args.tie_embeddings,
               "one matrix for embedding and output (tandem's own option)")->group(model);
  app.add_option("--rotary-base", v.model.rotary_base, "RoPE base")
      ->capture_default_str()->group(model);
  app.add_option("--norm-epsilon", v.model.norm_epsilon, "RMSNorm epsilon")
      ->capture_default_str()->group(model);
  app.add_option("--init-method-std", v.model.init_method_std, "std of the normal init")
      ->capture_default_str()->group(model);
}

// The parallel layout options.
void add_parallel_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string parallel = "Parallel layout";
  app.add_option("--tensor-model-parallel-size", v.parallel.tensor_parallel, "TP ranks")
      ->capture_default_str()->group(parallel);
  app.add_option("--pipeline-model-parallel-size", v.parallel.pipeline_parallel, "PP ranks")
      ->capture_default_str()->group(parallel);
  app.add_option("--context-parallel-size", v.parallel.context_parallel, "CP ranks")
      ->capture_default_str()->group(parallel);
  app.add_option("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_stage,
                 "layers per interleaved pipeline chunk (default: not interleaved)")
      ->check(at_least_one())->group(parallel);
  app.add_option("--num-virtual-stages-per-pipeline-rank", args.num_virtual_stages_per_pipeline_rank,
                 "interleaved model chunks per pipeline rank (the other way to ask for interleaving; "
                 "needed with an uneven first or last stage)")
      ->check(at_least_one())->group(parallel);
  app.add_option("--decoder-first-pipeline-num-layers", v.parallel.first_pipeline_stage_layers,
                 "decoder layers on the first pipeline stage (default: the even split)")
      ->check(at_least_one())->group(parallel);
  app.add_option("--decoder-last-pipeline-num-layers", v.parallel.last_pipeline_stage_layers,
                 "decoder layers on the last pipeline stage (default: the even split)")
      ->check(at_least_one())->group(parallel);
  app.add_flag("--account-for-embedding-in-pipeline-split",
               v.parallel.account_for_embedding_in_pipeline_split,
               "count the embedding as one layer of the first stage when splitting the layers")
      ->group(parallel);
  app.add_flag("--account-for-loss-in-pipeline-split", v.parallel.account_for_loss_in_pipeline_split,
               "count the loss as one layer of the last stage when splitting the layers")
      ->group(parallel);
  app.add_option("--world-size", v.parallel.world_size,
                 "ranks in all, for planning without a launcher (default: TP x PP x CP x DP)")
      ->group(parallel);
  app.add_option("--data-parallel-size", args.data_parallel_size,
                 "DP replicas (production: the ranks mpirun/srun started; the reference engine "
                 "and tandem check emulate them in one process; default: world / (TP x PP x CP))")
      ->group(parallel);
  app.add_flag("--sequence-parallel", v.parallel.sequence_parallel,
               "shard norms and dropout over TP (requires TP > 1)")->group(parallel);
  app.add_flag("--use-distributed-optimizer", v.parallel.use_distributed_optimizer,
               "shard fp32 main params and Adam moments over DP (production: each rank keeps "
               "its shard; bitwise the same result as without)")->group(parallel);
  app.add_flag("--overlap-grad-reduce", v.parallel.overlap_grad_reduce,
               "production, DP > 1: reduce the gradients bucket by bucket during the last "
               "microbatch's backward (no result changes a bit)")->group(parallel);
  app.add_flag("--overlap-param-gather", v.parallel.overlap_param_gather,
               "production, DP > 1: all-gather the updated weights bucket by bucket during the "
               "next forward (needs --use-distributed-optimizer and --overlap-grad-reduce)")
      ->group(parallel);
  app.add_option("--ddp-bucket-size", v.parallel.ddp_bucket_size,
                 "parameters per gradient bucket with --overlap-grad-reduce (default: "
                 "max(40M, 1M x DP); rounded up to a multiple of DP x 1024)")
      ->group(parallel);
}

// The activation recomputation options.
void add_memory_options(CLI::App& app, RunArguments& args) {
  const std::string memory = "Activation recomputation (Megatron's; no result changes a bit)";
  app.add_option("--recompute-granularity", args.recompute_granularity,
                 "none | selective | full: full recomputes whole layers in backward from their "
                 "inputs; selective recomputes core attention, which tandem's flash-style attention "
                 "always does (it stores what none stores) (default: none)")
      ->group(memory);
  app.add_option("--recompute-method", args.recompute_method,
                 "with full: uniform (each model chunk's layers in groups of --recompute-num-layers, "
                 "each keeping only its input) | block (the first --recompute-num-layers layers of "
                 "each model chunk keep only their inputs, the others everything)")
      ->group(memory);
  app.add_option("--recompute-num-layers", args.recompute_num_layers,
                 "with full: layers per group (uniform) or recomputed layers per model chunk (block)")
      ->check(at_least_one())->group(memory);
  app.add_flag("--recompute-activations", args.recompute_activations,
               "Megatron's spelling of --recompute-granularity selective")
      ->group(memory);
}

// The batch options.
void add_batch_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string batch = "Batch";
  app.add_option("--micro-batch-size", v.batch.micro_batch_size, "samples per microbatch")
      ->capture_default_str()->group(batch);
  app.add_option("--global-batch-size", v.batch.global_batch_size,
                 "samples per update = mbs x microbatches x DP")
      ->capture_default_str()->group(batch);
}

// The optimizer options.
void add_optimizer_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string optimizer = "Optimizer (SPEC 6, 7)";
  app.add_option("--optimizer", args.optimizer, "adam (AdamW with decoupled weight decay)")
      ->capture_default_str()->group(optimizer);
  app.add_option("--adam-beta1", v.optimizer.adam_beta1, "first-moment decay in [0, 1)")
      ->capture_default_str()->group(optimizer);
  app.add_option("--adam-beta2", v.optimizer.adam_beta2, "second-moment decay in [0, 1)")
      ->capture_default_str()->group(optimizer);
  app.add_option("--adam-eps", v.optimizer.adam_eps, "added to sqrt(v_hat), > 0")
      ->capture_default_str()->group(optimizer);
  app.add_option("--clip-grad", v.optimizer.clip_grad, "global gradient-norm threshold; 0 = off")
      ->capture_default_str()->group(optimizer);
  app.add_option("--weight-decay", v.schedule.weight_decay, "decoupled weight decay coefficient")
      ->capture_default_str()->group(optimizer);
  app.add_option("--weight-decay-incr-style", args.weight_decay_incr_style,
                 "constant | linear | cosine")->capture_default_str()->group(optimizer);
  app.add_option("--start-weight-decay", v.schedule.start_weight_decay,
                 "wd at sample 0 (linear/cosine styles)")->group(optimizer);
  app.add_option("--end-weight-decay", v.schedule.end_weight_decay,
                 "wd at the end of training (linear/cosine styles)")->group(optimizer);
  app.add_flag("--bf16", v.optimizer.bf16, "bf16 compute weights and activations, fp32 main state")
      ->group(optimizer);
  app.add_flag("--fp16", args.fp16, "not supported by tandem (use --bf16)")->group(optimizer);
}

// The learning-rate schedule options.
void add_schedule_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string schedule = "Learning-rate schedule (SPEC 8; samples are sequences)";
  app.add_option("--lr", v.schedule.lr, "peak learning rate")
      ->capture_default_str()->group(schedule);
  app.add_option("--min-lr", v.schedule.min_lr, "learning rate after decay")
      ->capture_default_str()->group(schedule);
  app.add_option("--lr-warmup-init", v.schedule.lr_warmup_init, "learning rate of update 1")
      ->capture_default_str()->group(schedule);
  app.add_option("--lr-decay-style", args.lr_decay_style, "linear | cosine | constant")
      ->capture_default_str()->group(schedule);
  app.add_option("--train-samples", v.schedule.train_samples,
                 "samples to train (rounded down to whole updates)")->group(schedule);
  app.add_option("--lr-warmup-samples", v.schedule.lr_warmup_samples, "warmup span W (samples)")
      ->capture_default_str()->group(schedule);
  app.add_option("--lr-decay-samples", v.schedule.lr_decay_samples,
                 "decay span D from sample 0 (samples; default: --train-samples)")
      ->group(schedule);
  app.add_option("--train-iters", args.train_iters, "updates to train (iteration-based)")
      ->group(schedule);
  app.add_option("--lr-warmup-iters", args.lr_warmup_iters, "warmup span (updates)")
      ->group(schedule);
  app.add_option("--lr-decay-iters", args.lr_decay_iters, "decay span (updates)")
      ->group(schedule);
  app.add_option("--lr-warmup-fraction", args.lr_warmup_fraction,
                 "warmup span as a fraction of the decay span")->group(schedule);
  app.add_option("--train-tokens", args.train_tokens,
                 "token budget such as 10T (tokens; rounded down to whole updates)")
      ->group(schedule);
  app.add_option("--lr-warmup-tokens", args.lr_warmup_tokens,
                 "warmup such as 20B (tokens; rounded up to whole updates)")->group(schedule);
}

// The data and loss options.
void add_data_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string data = "Data and loss (SPEC 2, 3, 5)";
  app.add_option("--data-path", args.data_paths,
                 "PREFIX of PREFIX.bin/.idx; or a blend as Megatron writes it, W1 P1 W2 P2 ... "
                 "(weights > 0, normalized; sample i comes from the dataset furthest behind "
                 "its share; each dataset continues into its next epoch), or P1 P2 ... weighted "
                 "by each dataset's samples per epoch; docs/DATA.md section 9 (default: the "
                 "embedded corpus)")->group(data);
  app.add_option("--tokenizer-type", args.tokenizer_type,
                 "the tokenizer the data was built with, for its EOD, PAD and vocabulary size: "
                 "GPT2BPETokenizer | HuggingFaceTokenizer | SentencePieceTokenizer | Llama2Tokenizer | NullTokenizer | "
                 "bytes (Megatron's names; "
                 "default: tandem's byte tokenizer; docs/DATA.md section 13)")->group(data);
  app.add_option("--null-tokenizer-eod-id", args.null_tokenizer_eod_id,
                 "NullTokenizer's EOD (default: --vocab-size - 1)")->group(data);
  app.add_option("--null-tokenizer-pad-id", args.null_tokenizer_pad_id,
                 "NullTokenizer's PAD (default: -1, none)")->capture_default_str()->group(data);
  app.add_option("--vocab-file", v.tokenizer.vocab_file, "GPT2BPETokenizer's vocab.json")->group(data);
  app.add_option("--merge-file", v.tokenizer.merge_file, "GPT2BPETokenizer's merges.txt")->group(data);
  app.add_option("--tokenizer-model", v.tokenizer.tokenizer_model,
                 "HuggingFaceTokenizer: a directory with tokenizer.json and tokenizer_config.json; "
                 "SentencePieceTokenizer, Llama2Tokenizer: the SentencePiece .model file")
      ->group(data);
  app.add_option("--split", v.data.split, "Megatron's train,valid,test weights (default: all "
                                          "train)")->group(data);
  app.add_option("--data-order", args.data_order, "sequential | shuffled (tandem's: per epoch, from --seed) | megatron (Megatron "
                 "Core's GPTDataset order from --seed, --split, --seq-length, --train-samples; "
                 "docs/DATA.md section 4)")
      ->capture_default_str()->group(data);
  app.add_option("--data-cache-path", v.data.data_cache_path,
                 "directory where --data-order megatron caches its document, sample and shuffle "
                 "indices and memory-maps them (created when missing; default: built in memory at "
                 "every start; docs/DATA.md section 4)")->group(data);
  app.add_option("--packing", args.packing, "concat | units")->capture_default_str()->group(data);
  app.add_flag("--reset-position-ids,!--no-reset-position-ids", v.data.reset_position_ids,
               "positions restart after each EOD (default on)")->group(data);
  app.add_flag("--reset-attention-mask,!--no-reset-attention-mask", v.data.reset_attention_mask,
               "attention stays inside each document (default on)")->group(data);
  app.add_flag("--eod-mask-loss,!--no-eod-mask-loss", v.data.eod_mask_loss,
               "no loss where the input token is EOD (default on)")->group(data);
  app.add_option("--loss-normalization", args.loss_normalization,
                 "per-token | microbatch-mean")->capture_default_str()->group(data);
  app.add_flag("--calculate-per-token-loss", args.calculate_per_token_loss,
               "Megatron's spelling of --loss-normalization per-token")->group(data);
  app.add_option("--seed", v.data.seed, "seed of every random stream")
      ->capture_default_str()->group(data);
}

// The checkpoint options.
void add_checkpoint_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string checkpoint = "Checkpoints (SPEC 9)";
  app.add_option("--save", v.checkpoint.save, "directory for checkpoints")->group(checkpoint);
  app.add_option("--load", v.checkpoint.load, "checkpoint directory to resume from")
      ->group(checkpoint);
  app.add_option("--save-interval", v.checkpoint.save_interval,
                 "updates between checkpoints (0 = at the end only)")
      ->capture_default_str()->group(checkpoint);
  app.add_flag("--override-opt-param-scheduler", v.checkpoint.override_opt_param_scheduler,
               "allow a changed optimizer or schedule setting on resume")->group(checkpoint);
}

// The validation options.
void add_evaluation_options(CLI::App& app, RunArguments& args) {
  RunConfig& v = args.values;
  const std::string evaluation = "Validation (Megatron's evaluation; docs/DATA.md section 12)";
  app.add_option("--eval-interval", v.evaluation.eval_interval,
                 "iterations between evaluations of the validation split (0 = only at the end "
                 "of training; needs a validation part in --split)")
      ->capture_default_str()->group(evaluation);
  app.add_option("--eval-iters", v.evaluation.eval_iters,
                 "global batches of the validation split per evaluation (0 = no evaluation; "
                 "takes effect only when --split gives the validation part a weight, e.g. "
                 "--split 969,30,1)")
      ->capture_default_str()->group(evaluation);
}

}  // namespace

void add_run_options(CLI::App& app, RunArguments& args) {
  args.app = &app;
  app.add_option("--config", args.config_path,
                 "JSON file of run options (keys: option names without --); command-line arguments "
                 "override it");

  add_model_options(app, args);
  add_parallel_options(app, args);
  add_memory_options(app, args);
  add_batch_options(app, args);
  add_optimizer_options(app, args);
  add_schedule_options(app, args);
  add_data_options(app, args);
  add_checkpoint_options(app, args);
  add_evaluation_options(app, args);

  // A repeated option takes its last value, as Megatron's argparse does, so a pasted fragment can
  // be followed by overrides. --data-path is the one list-valued option.
  for (CLI::Option* option : app.get_options()) {
    if (option->get_name() != "--data-path" && option->get_name() != "--config") {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
}

RunConfig build_run_config(const RunArguments& args, const LaunchContext& launch) {
  using namespace config_rules;
  // The file's options reach args.values through their options' own conversions (the bound
  // variables), as the command line's did.
  apply_config_file(args);
  RunConfig config = args.values;
  // Each component's rules (core/config_rules/), in the order their issues are reported. A
  // throw_if_any ends a stage: what follows it reads only values the stages before accepted.
  Checker checker;

  // Text options onto their enums; Megatron's choices tandem does not implement.
  check_model_choices(args, checker);
  check_optimizer_choices(args, checker);
  resolve_model_flags(args, config, checker);
  resolve_recompute(args, config, checker);
  resolve_schedule_styles(args, config, checker);
  resolve_data_choices(args, config, checker);
  checker.throw_if_any();
  check_split(config);
  check_megatron_model_defaults(args, config, checker);
  check_checkpoint_directories(config, checker);
  check_model_finite(config, checker);
  check_optimizer_finite(config, checker);
  check_schedule_finite(config, checker);
  checker.throw_if_any();

  // Counts at least 1, then every size within 2^31 - 1, then the derived sizes, then every
  // product of sizes within its bound: huge values crashed or overflowed silently.
  check_model_counts(config, checker);
  resolve_tokenizer(args, config, checker);
  check_vocabulary_and_sequence_counts(config, checker);
  check_layout_counts(config, checker);
  checker.throw_if_any();
  check_model_dimensions(config, checker);
  check_layout_dimensions(config, checker);
  checker.throw_if_any();
  derive_ffn_and_query_groups(args, config, checker);
  checker.throw_if_any();
  check_model_size_fits(config, checker);
  checker.throw_if_any();

  // The architecture against the parallel layout, the pipeline split and the world size.
  check_architecture_against_layout(args, launch, config, checker);
  resolve_parallel_options(args, config, checker);
  resolve_model_values(args, config, checker);
  resolve_pipeline_split(args, launch, config, checker);
  resolve_world_size(args, launch, config, checker);
  checker.throw_if_any();

  // The batch over DP, the optimizer and the learning rates.
  check_global_batch(config, checker);
  check_optimizer_values(config, checker);
  check_learning_rates(config, checker);
  checker.throw_if_any();

  // The schedule's spans, converted to samples.
  check_span_units(args, checker);
  checker.throw_if_any();
  convert_iterations(args, config, checker);
  check_sample_counts(config, checker);
  checker.throw_if_any();
  apply_token_budgets(args, config, checker);
  checker.throw_if_any();
  derive_spans(args, launch, config, checker);
  resolve_weight_decay_schedule(args, config, checker);
  check_save_interval(config, checker);
  resolve_evaluation(args, config, checker);
  checker.throw_if_any();
  return config;
}

namespace {

// Levenshtein distance, for "did you mean".
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The long option names of the subcommand named by argv[1] (or of `app`).
std::vector<std::string> option_names(CLI::App& app, int argc, const char* const* argv) {
  CLI::App* command = &app;
  if (argc > 1) {
    for (CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == argv[1]) command = sub;
    }
  }
  std::vector<std::string> names;
  for (const CLI::Option* option : command->get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

// The words the parser could not place (`extras`, which CLI11 lists in reverse), in the order
// given, each unknown option with the nearest option's name ("--hiden-size: no such option; did
// you mean --hidden-size?").
std::string unplaced_words(CLI::App& app, int argc, const char* const* argv, const std::string& extras_message) {
  std::vector<std::string> extras;
  std::istringstream listed(extras_message.substr(extras_message.find(": ") + 2));
  for (std::string word; listed >> word;) extras.push_back(word);
  const std::vector<std::string> names = option_names(app, argc, argv);
  std::string out;
  std::vector<std::string> stray;
  for (int i = 2; i < argc; ++i) {
    std::string word = argv[i];
    const auto extra = std::find(extras.begin(), extras.end(), word);
    if (extra == extras.end()) continue;
    extras.erase(extra);
    if (word.rfind("--", 0) != 0) {
      stray.push_back(word);
      continue;
    }
    word = word.substr(0, word.find('='));
    std::string nearest;
    std::size_t best = 4;  // suggest only a close name
    for (const std::string& name : names) {
      // The distance is at least the difference of the lengths: a name that cannot come closer
      // than `best` is not compared (a 100,000-character word took 0.3 s against every name).
      const std::size_t length_difference = word.size() > name.size() ? word.size() - name.size() : name.size() - word.size();
      if (length_difference >= best) continue;
      const std::size_t distance = edit_distance(word, name);
      if (distance < best) {
        best = distance;
        nearest = name;
      }
    }
    out += "error: " + word + ": no such option" + (nearest.empty() ? "" : "; did you mean " + nearest + "?") + "\n";
  }
  if (!stray.empty()) {
    out += "error: words that belong to no option:";
    for (const std::string& word : stray) out += " " + word;
    out += "\n";
  }
  return out;
}

}  // namespace

std::optional<int> parse_or_exit_code(CLI::App& app, int argc, const char* const* argv) {
  // A single dash before a long name (-hidden-size) reads as -h plus letters and printed the
  // help with exit 0.
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.size() > 2 && word[0] == '-' && word[1] != '-' && std::isalpha(static_cast<unsigned char>(word[1])) &&
        std::isalpha(static_cast<unsigned char>(word[2]))) {
      std::cerr << "error: " << word << ": one dash before a long option name; fix: -" << word << "\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    const bool extras = dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr;
    const std::string unknown = extras ? unplaced_words(app, argc, argv, error.what()) : std::string();
    if (!unknown.empty()) {
      std::cerr << unknown;
    } else {
      std::cerr << "error: " << error.what() << "\n";
    }
    std::cerr << "fix: see `" << app.get_name() << (argc > 1 ? std::string(" ") + argv[1] : std::string())
              << " --help` for every option\n";
    return 2;
  } catch (const ConfigError& error) {
    std::cerr << error.what();
    return 2;
  }
  return std::nullopt;
}

}  // namespace tandem
