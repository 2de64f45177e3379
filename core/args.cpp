// Megatron-style arguments -> RunConfig: option binding, the JSON config file, derived defaults
// and every validation rule (SPEC 10, 12; issue "Foundation" item 4).
#include "core/args.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/data/blend.hpp"
#include "core/data/split.hpp"
#include "core/data/tokenizer.hpp"
#include "core/pipeline_layout.hpp"

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

std::string text(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}
std::string text(std::int64_t value) { return std::to_string(value); }

// Collects broken rules; `check(condition, ...)` records one when the condition is false.
// The options that describe the model's architecture.
constexpr std::array kArchitectureOptions{"--num-layers",        "--hidden-size",          "--ffn-hidden-size",
                                          "--num-attention-heads", "--num-query-groups", "--group-query-attention"};

class Checker {
 public:
  void fail(std::string field, std::string value, std::string rule, std::string fix) {
    issues_.push_back({std::move(field), std::move(value), std::move(rule), std::move(fix)});
  }
  void check(bool ok, std::string field, std::string value, std::string rule, std::string fix) {
    if (!ok) fail(std::move(field), std::move(value), std::move(rule), std::move(fix));
  }
  void throw_if_any() const {
    if (!issues_.empty()) throw ConfigError(issues_);
  }

 private:
  std::vector<ConfigIssue> issues_;
};

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// SPEC 13: the special ids and the vocabulary size come from the tokenizer the data was built
// with (docs/DATA.md section 13); the byte tokenizer's only when none is named.
void resolve_tokenizer(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& tokenizer = config.tokenizer;
  const std::string kinds =
      "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer or bytes";
  if (args.given("--tokenizer-type")) {
    const auto type = data::parse_tokenizer_type(args.tokenizer_type);
    if (!type) {
      checker.fail("--tokenizer-type", args.tokenizer_type,
                   "is not a tokenizer type tandem reads (" + kinds + "; Megatron's spelling)",
                   "name the tokenizer the data was built with, e.g. --tokenizer-type GPT2BPETokenizer");
      return;
    }
    tokenizer.type = *type;
  }
  // Megatron ignores a file option its tokenizer type does not read; tandem says so.
  const auto read_only_by = [&](const char* option, const std::string& value, bool read, const char* readers) {
    checker.check(!args.given(option) || read, option, value,
                  "is read only by --tokenizer-type " + std::string(readers) + ", not " + to_string(tokenizer.type),
                  "drop it, or name the tokenizer that reads it");
  };
  const bool gpt2 = tokenizer.type == TokenizerType::gpt2_bpe;
  read_only_by("--vocab-file", tokenizer.vocab_file, gpt2, "GPT2BPETokenizer");
  read_only_by("--merge-file", tokenizer.merge_file, gpt2, "GPT2BPETokenizer");
  const bool null = tokenizer.type == TokenizerType::null_tokenizer;
  read_only_by("--null-tokenizer-eod-id", std::to_string(args.null_tokenizer_eod_id), null, "NullTokenizer");
  read_only_by("--null-tokenizer-pad-id", std::to_string(args.null_tokenizer_pad_id), null, "NullTokenizer");
  read_only_by("--tokenizer-model", tokenizer.tokenizer_model,
               tokenizer.type == TokenizerType::huggingface || tokenizer.type == TokenizerType::sentencepiece ||
                   tokenizer.type == TokenizerType::llama2,
               "HuggingFaceTokenizer, SentencePieceTokenizer or Llama2Tokenizer");
  // The byte tokenizer with another --vocab-size plans (the seed's fragment gives 128,256 ids);
  // a run that reads data with it is refused (data::open_training_samples_at).
  if (tokenizer.type == TokenizerType::bytes) return;
  if (tokenizer.type == TokenizerType::null_tokenizer) {
    checker.check(args.given("--vocab-size"), "--vocab-size", "not given",
                  "--tokenizer-type NullTokenizer takes its size from --vocab-size (Megatron asserts it is given)",
                  "give --vocab-size N, the number of the data's ids (EOD = N - 1 unless --null-tokenizer-eod-id)");
    if (!args.given("--vocab-size")) return;
  }
  try {
    data::NullTokenizerOptions null_options;
    null_options.vocab_size = config.model.vocab_size;
    if (args.given("--null-tokenizer-eod-id")) null_options.eod_id = args.null_tokenizer_eod_id;
    null_options.pad_id = args.null_tokenizer_pad_id;
    const data::TokenizerIds ids = data::read_tokenizer_ids(tokenizer, null_options);
    if (tokenizer.type != TokenizerType::null_tokenizer) {
      // Megatron ignores --vocab-size beside a real tokenizer; tandem refuses a disagreeing one.
      checker.check(!args.given("--vocab-size") || config.model.vocab_size == ids.vocab_size, "--vocab-size",
                    std::to_string(config.model.vocab_size),
                    "differs from the " + std::to_string(ids.vocab_size) + " ids of --tokenizer-type " +
                        to_string(tokenizer.type) + " (the vocabulary size comes from the tokenizer, as in Megatron)",
                    "drop --vocab-size");
    }
    config.model.vocab_size = ids.vocab_size;
    tokenizer.eod_token = ids.eod_token;
    tokenizer.pad_token = ids.pad_token;
  } catch (const ConfigError& error) {
    for (const auto& issue : error.issues()) checker.fail(issue.field, issue.value, issue.rule, issue.fix);
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

void add_run_options(CLI::App& app, RunArguments& args) {
  args.app = &app;
  RunConfig& v = args.values;
  app.add_option("--config", args.config_path,
                 "JSON file of run options (keys: option names without --); command-line arguments "
                 "override it");

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

  const std::string batch = "Batch";
  app.add_option("--micro-batch-size", v.batch.micro_batch_size, "samples per microbatch")
      ->capture_default_str()->group(batch);
  app.add_option("--global-batch-size", v.batch.global_batch_size,
                 "samples per update = mbs x microbatches x DP")
      ->capture_default_str()->group(batch);

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

  const std::string checkpoint = "Checkpoints (SPEC 9)";
  app.add_option("--save", v.checkpoint.save, "directory for checkpoints")->group(checkpoint);
  app.add_option("--load", v.checkpoint.load, "checkpoint directory to resume from")
      ->group(checkpoint);
  app.add_option("--save-interval", v.checkpoint.save_interval,
                 "updates between checkpoints (0 = at the end only)")
      ->capture_default_str()->group(checkpoint);
  app.add_flag("--override-opt-param-scheduler", v.checkpoint.override_opt_param_scheduler,
               "allow a changed optimizer or schedule setting on resume")->group(checkpoint);

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

  // A repeated option takes its last value, as Megatron's argparse does, so a pasted fragment can
  // be followed by overrides. --data-path is the one list-valued option.
  for (CLI::Option* option : app.get_options()) {
    if (option->get_name() != "--data-path" && option->get_name() != "--config") {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
}

RunConfig build_run_config(const RunArguments& args, const LaunchContext& launch) {
  // The file's options reach args.values through their options' own conversions (the bound
  // variables), as the command line's did.
  apply_config_file(args);
  RunConfig config = args.values;
  // A rule broken by a value the user never wrote says that it is a default.
  const auto default_note = [&args](const char* option) {
    return args.given(option) ? std::string() : std::string(" (the default: not given)");
  };
  Checker checker;
  auto& model = config.model;
  auto& parallel = config.parallel;
  auto& batch = config.batch;
  auto& optimizer = config.optimizer;
  auto& schedule = config.schedule;
  auto& data = config.data;

  // Names and unsupported Megatron choices.
  checker.check(args.normalization == "RMSNorm", "--normalization", args.normalization,
                "tandem implements RMSNorm only (SPEC 4)", "use --normalization RMSNorm");
  checker.check(args.position_embedding_type == "rope", "--position-embedding-type",
                args.position_embedding_type, "tandem implements rotary embeddings only (SPEC 4)",
                "use --position-embedding-type rope");
  checker.check(args.optimizer == "adam", "--optimizer", args.optimizer,
                "tandem implements AdamW (Megatron's adam with decoupled decay) only (SPEC 7)",
                "use --optimizer adam");
  checker.check(!args.fp16, "--fp16", "true", "fp16 training is not supported (SPEC 7)",
                "use --bf16, or neither for fp32");
  checker.check(!(args.disable_bias_linear && model.add_bias_linear), "--add-bias-linear", "true",
                "contradicts --disable-bias-linear", "give only one of the two");
  checker.check(!(args.untie_embeddings && args.tie_embeddings),
                "--tie-embeddings-and-output-weights", "true",
                "contradicts --untie-embeddings-and-output-weights", "give only one of the two");
  model.tie_embeddings = args.tie_embeddings;

  // Megatron's recompute rules (TransformerConfig.__post_init__; --recompute-activations sets
  // selective in its arguments.py). A method given without a granularity is ignored, as there.
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

  if (args.lr_decay_style == "linear") {
    schedule.lr_decay_style = LrDecayStyle::linear;
  } else if (args.lr_decay_style == "cosine") {
    schedule.lr_decay_style = LrDecayStyle::cosine;
  } else if (args.lr_decay_style == "constant") {
    schedule.lr_decay_style = LrDecayStyle::constant;
  } else {
    checker.fail("--lr-decay-style", args.lr_decay_style,
                 "tandem supports linear, cosine and constant (SPEC 8)",
                 "use one of linear, cosine, constant");
  }
  if (args.weight_decay_incr_style == "constant") {
    schedule.weight_decay_incr_style = WeightDecayIncrStyle::constant;
  } else if (args.weight_decay_incr_style == "linear") {
    schedule.weight_decay_incr_style = WeightDecayIncrStyle::linear;
  } else if (args.weight_decay_incr_style == "cosine") {
    schedule.weight_decay_incr_style = WeightDecayIncrStyle::cosine;
  } else {
    checker.fail("--weight-decay-incr-style", args.weight_decay_incr_style,
                 "must be constant, linear or cosine (Megatron)", "use one of those three");
  }
  if (args.loss_normalization == "per-token") {
    data.loss_normalization = LossNormalization::per_token;
  } else if (args.loss_normalization == "microbatch-mean") {
    data.loss_normalization = LossNormalization::microbatch_mean;
  } else {
    checker.fail("--loss-normalization", args.loss_normalization,
                 "must be per-token or microbatch-mean (SPEC 5)", "use one of those two");
  }
  checker.check(!(args.calculate_per_token_loss &&
                  data.loss_normalization != LossNormalization::per_token),
                "--calculate-per-token-loss", "true",
                "contradicts --loss-normalization " + args.loss_normalization,
                "give only one of the two");
  if (args.data_order == "sequential") {
    data.data_order = DataOrder::sequential;
  } else if (args.data_order == "shuffled") {
    data.data_order = DataOrder::shuffled;
  } else if (args.data_order == "megatron") {
    data.data_order = DataOrder::megatron;
  } else {
    checker.fail("--data-order", args.data_order, "must be sequential, shuffled or megatron (SPEC 12, 13)",
                 "use one of those three");
  }
  if (args.packing == "concat") {
    data.packing = Packing::concat;
  } else if (args.packing == "units") {
    data.packing = Packing::units;
  } else {
    checker.fail("--packing", args.packing, "must be concat or units (SPEC 2)",
                 "use one of those two");
  }
  try {
    data.data_path = data::parse_data_path(args.data_paths);
  } catch (const ConfigError& error) {
    for (const auto& issue : error.issues()) checker.fail(issue.field, issue.value, issue.rule, issue.fix);
  }
  if (data.data_order == DataOrder::megatron) {
    // Megatron's GPTDataset packs by concatenation and seeds numpy's RandomState with --seed.
    checker.check(data.packing == Packing::concat, "--packing", args.packing,
                  "--data-order megatron is Megatron's GPTDataset, which concatenates documents",
                  "use --packing concat (the default) or another --data-order");
    checker.check(data.seed < (std::uint64_t{1} << 32), "--seed", std::to_string(data.seed),
                  "--data-order megatron seeds numpy.random.RandomState, which takes [0, 2^32)",
                  "give a smaller --seed");
  }
  if (!data.data_cache_path.empty() && data.data_order != DataOrder::megatron) {
    config.argument_warnings.push_back("--data-cache-path " + data.data_cache_path + " with --data-order " +
                                       args.data_order + ": unused (only --data-order megatron builds index files)");
  }
  checker.throw_if_any();
  if (!data.split.empty()) data::parse_split_weights(data.split);  // throws ConfigError on --split

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

  // --save and --load name directories: an existing file there is refused before anything runs
  // (--save FILE gave a raw file-system error; --load FILE would start from the initialization).
  for (const auto& [path, field] : std::initializer_list<std::pair<const std::string*, const char*>>{
           {&config.checkpoint.save, "--save"}, {&config.checkpoint.load, "--load"}}) {
    std::error_code ignored;
    checker.check(path->empty() || !std::filesystem::exists(*path, ignored) || std::filesystem::is_directory(*path, ignored),
                  field, *path, "is a file: it must name a directory", "give a directory (it is created when missing)");
  }

  // Every real-valued setting is a finite number: `--lr inf` or `--lr 1e400` (which parses as
  // infinity) would train to NaN and exit 0.
  for (const auto& [value, field] : std::initializer_list<std::pair<double, const char*>>{
           {model.rotary_base, "--rotary-base"}, {model.norm_epsilon, "--norm-epsilon"},
           {model.init_method_std, "--init-method-std"}, {config.optimizer.adam_beta1, "--adam-beta1"},
           {config.optimizer.adam_beta2, "--adam-beta2"}, {config.optimizer.adam_eps, "--adam-eps"},
           {config.optimizer.clip_grad, "--clip-grad"}, {config.schedule.lr, "--lr"},
           {config.schedule.min_lr, "--min-lr"}, {config.schedule.lr_warmup_init, "--lr-warmup-init"},
           {config.schedule.weight_decay, "--weight-decay"},
           {config.schedule.start_weight_decay, "--start-weight-decay"},
           {config.schedule.end_weight_decay, "--end-weight-decay"}}) {
    checker.check(std::isfinite(value), field, text(value), "must be a finite number",
                  "give a finite value (1e400 overflows to infinity)");
  }
  checker.throw_if_any();

  // Model shape.
  auto positive = [&](std::int64_t value, const char* field) {
    checker.check(value >= 1, field, text(value), "must be at least 1", "give a positive count");
  };
  positive(model.num_layers, "--num-layers");
  positive(model.hidden_size, "--hidden-size");
  positive(model.num_attention_heads, "--num-attention-heads");
  positive(model.vocab_size, "--vocab-size");
  resolve_tokenizer(args, config, checker);
  positive(model.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by");
  positive(model.seq_length, "--seq-length");
  positive(parallel.tensor_parallel, "--tensor-model-parallel-size");
  positive(parallel.pipeline_parallel, "--pipeline-model-parallel-size");
  positive(parallel.context_parallel, "--context-parallel-size");
  positive(batch.micro_batch_size, "--micro-batch-size");
  positive(batch.global_batch_size, "--global-batch-size");
  checker.throw_if_any();

  // Every size and every product of sizes fits before anything uses it: a dimension in 2^31 - 1
  // (kernels index with it; MPI counts are int), and the parameter count, the tokens of an update
  // and every sample count in 2^53 (exact in the schedule's double arithmetic). Huge values
  // crashed (segfault, SIGFPE) or overflowed silently.
  constexpr std::int64_t kMaxDimension = 2147483647;
  constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;
  for (const auto& [value, field] : std::initializer_list<std::pair<std::int64_t, const char*>>{
           {model.num_layers, "--num-layers"}, {model.hidden_size, "--hidden-size"},
           {model.ffn_hidden_size, "--ffn-hidden-size"}, {model.num_attention_heads, "--num-attention-heads"},
           {model.num_query_groups, "--num-query-groups"}, {model.vocab_size, "--vocab-size"},
           {model.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by"}, {model.seq_length, "--seq-length"},
           {parallel.tensor_parallel, "--tensor-model-parallel-size"},
           {parallel.pipeline_parallel, "--pipeline-model-parallel-size"},
           {parallel.context_parallel, "--context-parallel-size"}, {batch.micro_batch_size, "--micro-batch-size"},
           {batch.global_batch_size, "--global-batch-size"}}) {
    checker.check(value <= kMaxDimension, field, std::to_string(value),
                  "must be at most 2,147,483,647 (2^31 - 1: tandem's kernels index with it)",
                  "give a realistic size");
  }
  checker.throw_if_any();
  if (!args.given("--ffn-hidden-size")) {
    model.ffn_hidden_size = std::max<std::int64_t>(64, (8 * model.hidden_size / 3) / 64 * 64);
  }
  positive(model.ffn_hidden_size, "--ffn-hidden-size");
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
  positive(model.num_query_groups, "--num-query-groups");
  checker.throw_if_any();

  {
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
  checker.throw_if_any();

  const std::int64_t tp = parallel.tensor_parallel;
  const std::int64_t pp = parallel.pipeline_parallel;
  const std::int64_t cp = parallel.context_parallel;
  // A command that does not read the architecture (tandem schedule) holds only the architecture
  // the user gave to the layout's rules, not defaults the user never wrote.
  const bool architecture_given = std::any_of(
      kArchitectureOptions.begin(), kArchitectureOptions.end(), [&args](const char* option) { return args.given(option); });
  if (launch.needs_architecture || architecture_given) {
    checker.check(model.hidden_size % model.num_attention_heads == 0, "--hidden-size",
                  text(model.hidden_size),
                  "must be divisible by --num-attention-heads (" +
                      text(model.num_attention_heads) + ")",
                  "choose a width that is a multiple of the head count");
    checker.check(model.num_attention_heads % model.num_query_groups == 0, "--num-attention-heads",
                  text(model.num_attention_heads),
                  "must be divisible by --num-query-groups (" + text(model.num_query_groups) + ")",
                  "choose G dividing H");
    checker.check(model.num_attention_heads % tp == 0, "--num-attention-heads",
                  text(model.num_attention_heads) + default_note("--num-attention-heads"),
                  "must be divisible by --tensor-model-parallel-size (" + text(tp) + ")",
                  "choose H a multiple of TP, or a smaller TP");
    // Megatron 0.19: G >= TP splits the groups over the TP ranks; G < TP gives each group to TP/G
    // ranks, which hold its key/value rows whole.
    checker.check(model.num_query_groups % tp == 0 || tp % model.num_query_groups == 0, "--num-query-groups",
                  text(model.num_query_groups),
                  "must be a multiple or a divisor of --tensor-model-parallel-size (" + text(tp) + ") (Megatron)",
                  "choose G a multiple or a divisor of TP");
    // Megatron splits the MLP's hidden dimension over TP ranks.
    checker.check(model.ffn_hidden_size % tp == 0, "--ffn-hidden-size",
                  text(model.ffn_hidden_size) + default_note("--ffn-hidden-size"),
                  "must be divisible by --tensor-model-parallel-size (" + text(tp) + ")",
                  "choose F a multiple of TP");
    checker.check(model.head_dim() % 2 == 0 || model.hidden_size % model.num_attention_heads != 0,
                  "--hidden-size", text(model.hidden_size),
                  "head dim d/H must be even for rotary pairs (SPEC 4)",
                  "choose d and H with an even d/H");
  }
  if (parallel.sequence_parallel && tp == 1) {
    // Megatron: "Disabling sequence parallelism because tensor model parallelism is disabled".
    parallel.sequence_parallel = false;
    config.argument_warnings.push_back(
        "--sequence-parallel with --tensor-model-parallel-size 1: sequence parallelism turned off, as Megatron "
        "does (it splits the sequence over TP ranks)");
  }
  // Megatron splits the sequence into 2 x CP chunks (load-balanced causal attention).
  checker.check(cp == 1 || model.seq_length % (2 * cp) == 0, "--seq-length", text(model.seq_length),
                "must be divisible by 2 x --context-parallel-size (" + text(2 * cp) + ") (Megatron)",
                "choose a sequence length that is a multiple of 2 x CP");
  checker.check(!parallel.sequence_parallel || model.seq_length % tp == 0, "--seq-length",
                text(model.seq_length),
                "must be divisible by --tensor-model-parallel-size (" + text(tp) +
                    ") with --sequence-parallel: each TP rank holds seq / TP positions (Megatron)",
                "choose a sequence length that is a multiple of TP");
  // Megatron's rules for the overlap options.
  checker.check(!parallel.overlap_param_gather || parallel.use_distributed_optimizer,
                "--overlap-param-gather", "true",
                "is only supported with the distributed optimizer (Megatron)",
                "add --use-distributed-optimizer, or drop --overlap-param-gather");
  checker.check(!parallel.overlap_param_gather || parallel.overlap_grad_reduce,
                "--overlap-param-gather", "true", "must be used with --overlap-grad-reduce (Megatron)",
                "add --overlap-grad-reduce, or drop --overlap-param-gather");
  checker.check(!args.given("--ddp-bucket-size") || parallel.ddp_bucket_size > 0, "--ddp-bucket-size",
                text(parallel.ddp_bucket_size), "must be at least 1", "give a positive parameter count");
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

  // Interleaving (Megatron's arguments.py): chunks per rank from the layers per chunk or given.
  checker.check(args.num_layers_per_virtual_stage == 0 || args.num_virtual_stages_per_pipeline_rank == 0,
                "--num-layers-per-virtual-pipeline-stage", text(args.num_layers_per_virtual_stage),
                "cannot be set together with --num-virtual-stages-per-pipeline-rank (Megatron)",
                "give one of the two");
  const bool uneven = parallel.first_pipeline_stage_layers > 0 || parallel.last_pipeline_stage_layers > 0;
  checker.check(args.num_layers_per_virtual_stage == 0 || !uneven, "--num-layers-per-virtual-pipeline-stage",
                text(args.num_layers_per_virtual_stage),
                "cannot express chunks with an uneven first or last stage (Megatron)",
                "use --num-virtual-stages-per-pipeline-rank");
  if (args.num_virtual_stages_per_pipeline_rank > 0) {
    parallel.virtual_pipeline_stages = args.num_virtual_stages_per_pipeline_rank;
  } else if (args.num_layers_per_virtual_stage > 0 && !uneven) {
    const std::int64_t accounted = model.num_layers + parallel.account_for_embedding_in_pipeline_split +
                                   parallel.account_for_loss_in_pipeline_split;
    const std::int64_t layers_per_stage = accounted / pp;
    checker.check(pp > 1, "--num-layers-per-virtual-pipeline-stage",
                  text(args.num_layers_per_virtual_stage),
                  "interleaving needs --pipeline-model-parallel-size > 1 (Megatron)",
                  "drop it or raise PP");
    checker.check(layers_per_stage % args.num_layers_per_virtual_stage == 0,
                  "--num-layers-per-virtual-pipeline-stage",
                  text(args.num_layers_per_virtual_stage),
                  "must divide the layers per pipeline stage (" + text(layers_per_stage) + ")",
                  "choose a divisor of L / PP");
    if (layers_per_stage % args.num_layers_per_virtual_stage == 0) {
      parallel.virtual_pipeline_stages = std::max<std::int64_t>(1, layers_per_stage / args.num_layers_per_virtual_stage);
    }
  }
  // The layers of every stage and chunk (Megatron's split; core/pipeline_layout.hpp).
  if (launch.needs_architecture || architecture_given) {
    try {
      (void)PipelineStages(pipeline_split(model, parallel));
    } catch (const ConfigError& error) {
      for (const ConfigIssue& issue : error.issues()) checker.fail(issue.field, issue.value, issue.rule, issue.fix);
    }
  }

  // World size and DP: the launcher when training; --world-size or --data-parallel-size when not.
  const std::int64_t model_parallel = tp * pp * cp;
  std::optional<std::int64_t> world;
  std::string world_source = "--world-size";
  if (launch.launched_world_size) {
    world = *launch.launched_world_size;
    world_source = "launch world size";
    checker.check(!args.given("--world-size") || parallel.world_size == *world, "--world-size",
                  text(parallel.world_size),
                  "differs from the " + text(*world) + " ranks the launcher started",
                  "drop --world-size when training");
  } else if (args.given("--world-size")) {
    world = parallel.world_size;
  }
  if (world) {
    checker.check(*world >= 1 && *world % model_parallel == 0, world_source, text(*world),
                  "TP x PP x CP x DP must equal the world size; TP x PP x CP = " +
                      text(model_parallel),
                  "use a world size that is a multiple of " + text(model_parallel));
    parallel.data_parallel = *world / model_parallel;
    checker.check(args.data_parallel_size == 0 || args.data_parallel_size == parallel.data_parallel,
                  "--data-parallel-size", text(args.data_parallel_size),
                  "TP x PP x CP x DP must equal the world size (" + text(*world) + ")",
                  "use --data-parallel-size " + text(std::max<std::int64_t>(parallel.data_parallel, 1)) +
                      " or drop it");
  } else {
    parallel.data_parallel = args.data_parallel_size > 0 ? args.data_parallel_size : 1;
    checker.check(args.data_parallel_size >= 0, "--data-parallel-size",
                  text(args.data_parallel_size), "must be at least 1", "give a positive count");
  }
  parallel.world_size = model_parallel * parallel.data_parallel;
  checker.throw_if_any();

  const std::int64_t samples_per_microbatch_round = batch.micro_batch_size * parallel.data_parallel;
  checker.check(batch.global_batch_size % samples_per_microbatch_round == 0,
                "--global-batch-size", text(batch.global_batch_size),
                "must be divisible by --micro-batch-size x DP (" + text(batch.micro_batch_size) +
                    " x " + text(parallel.data_parallel) + " = " +
                    text(samples_per_microbatch_round) + ")",
                "use a multiple of " + text(samples_per_microbatch_round));
  if (parallel.virtual_pipeline_stages > 1 && batch.global_batch_size % samples_per_microbatch_round == 0) {
    const std::int64_t microbatches = batch.global_batch_size / samples_per_microbatch_round;
    const std::string problem = interleaved_schedule_problem(parallel.pipeline_parallel, microbatches);
    checker.check(problem.empty(), "--global-batch-size", text(batch.global_batch_size),
                  problem + "; microbatches per replica = GBS / (--micro-batch-size x DP) = " + text(microbatches),
                  "use a global batch size giving a multiple of " + text(parallel.pipeline_parallel) +
                      " microbatches per replica, or drop the interleaving");
  }

  // Optimizer.
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

  // Learning rate values.
  checker.check(schedule.lr > 0.0, "--lr", text(schedule.lr), "must be > 0",
                "give the peak learning rate");
  checker.check(schedule.min_lr >= 0.0 && schedule.min_lr <= schedule.lr, "--min-lr",
                text(schedule.min_lr), "must satisfy 0 <= min-lr <= lr (" + text(schedule.lr) + ")",
                "lower --min-lr or raise --lr");
  checker.check(schedule.lr_warmup_init >= 0.0 && schedule.lr_warmup_init <= schedule.lr,
                "--lr-warmup-init", text(schedule.lr_warmup_init),
                "must satisfy 0 <= lr-warmup-init <= lr", "use 0");
  checker.throw_if_any();

  // Schedule spans: samples, iterations or tokens, never mixed (Megatron asserts the same).
  const std::int64_t gbs = batch.global_batch_size;
  const std::int64_t tokens_per_update = gbs * model.seq_length;
  const bool sample_based = args.given("--train-samples") || args.given("--lr-warmup-samples") ||
                            args.given("--lr-decay-samples");
  const bool iteration_based = args.given("--train-iters") || args.given("--lr-warmup-iters") ||
                               args.given("--lr-decay-iters");
  if (sample_based && iteration_based) {
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
  checker.throw_if_any();

  if (iteration_based) {
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
  for (const auto& [samples, field] : std::initializer_list<std::pair<std::int64_t, const char*>>{
           {schedule.train_samples, "--train-samples"}, {schedule.lr_warmup_samples, "--lr-warmup-samples"},
           {schedule.lr_decay_samples, "--lr-decay-samples"}}) {
    checker.check(samples <= (std::int64_t{1} << 53), field, text(static_cast<double>(samples)),
                  "is beyond 2^53 samples (the schedule counts them exactly in double)",
                  "give a realistic count");
  }
  checker.throw_if_any();
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
  checker.throw_if_any();

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

  // Weight decay schedule (Megatron: constant forbids start/end; the others need both).
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
  checker.check(config.checkpoint.save_interval >= 0, "--save-interval",
                text(config.checkpoint.save_interval), "must be >= 0",
                "use 0 to save only at the end");

  // Evaluation (Megatron's --eval-interval, --eval-iters): only with a validation part in --split.
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
