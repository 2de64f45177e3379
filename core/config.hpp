// The validated configuration of a tandem run: one struct per component (SPEC 10, 12).
// Built once from Megatron-style arguments and/or a JSON file (core/args.hpp), validated where it
// is built, printed whole at startup and written into log headers and checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem {

// The byte tokenizer of SPEC 12: ids 0-255 are UTF-8 bytes.
inline constexpr std::int64_t kByteVocabularySize = 258;
inline constexpr std::int32_t kEodToken = 256;
inline constexpr std::int32_t kPadToken = 257;
// A tokenizer without a padding token: Megatron's GPTDataset then pads with -1 (its
// _PAD_TOKEN_ID) and maps it to 0 before the embedding; so does build_sample.
inline constexpr std::int32_t kNoPadToken = -1;

// Megatron's --tokenizer-type values tandem reads (docs/DATA.md section 13), and tandem's own
// byte tokenizer, the default when none is named.
enum class TokenizerType { bytes, gpt2_bpe, huggingface, sentencepiece, llama2, null_tokenizer };

// Which tokenizer the data was built with, and the special ids taken from it (SPEC 13: "Special
// token ids come from the tokenizer"). Resolved once by build_run_config, which reads the files;
// the vocabulary size lands in ModelConfig::vocab_size.
struct TokenizerConfig {
  TokenizerType type = TokenizerType::bytes;
  std::string vocab_file;        // --vocab-file: GPT2BPETokenizer's vocab.json
  std::string merge_file;        // --merge-file: GPT2BPETokenizer's merges.txt (required, unread)
  std::string tokenizer_model;   // --tokenizer-model: HuggingFaceTokenizer's directory
  std::int32_t eod_token = kEodToken;  // end of document: the masks' and positions' boundary
  std::int32_t pad_token = kPadToken;  // padding; kNoPadToken when the tokenizer has none
  bool named() const { return type != TokenizerType::bytes; }
};

struct ModelConfig {
  std::int64_t num_layers = 2;          // decoder blocks L; >= 1, divisible by PP
  std::int64_t hidden_size = 32;        // model width d; divisible by heads
  std::int64_t ffn_hidden_size = 64;    // SwiGLU hidden F; Megatron's SwiGLU default int(8d/3 / 64)*64
  std::int64_t num_attention_heads = 4; // query heads H; divisible by groups and by TP
  std::int64_t num_query_groups = 4;    // key/value groups G (GQA); = H unless --group-query-attention
  std::int64_t vocab_size = kByteVocabularySize;  // tokenizer size before padding (SPEC 12)
  std::int64_t make_vocab_size_divisible_by = 128;  // padded vocab is a multiple of this x TP
  std::int64_t padded_vocab_size = 384; // derived: vocab_size rounded up to a multiple of above x TP
  std::int64_t seq_length = 32;         // input positions per sample (tokens)
  bool add_bias_linear = false;         // SPEC 4: biases off by default (--disable-bias-linear)
  bool tie_embeddings = false;          // SPEC 4: untied by default (Megatron ties by default)
  double rotary_base = 10000.0;         // RoPE base (SPEC 4)
  double norm_epsilon = 1e-5;           // RMSNorm epsilon (SPEC 4)
  double init_method_std = 0.02;        // std of normal init for matrices (SPEC 4)

  std::int64_t head_dim() const { return hidden_size / num_attention_heads; }
  std::int64_t kv_width() const { return num_query_groups * head_dim(); }
};

struct ParallelConfig {
  std::int64_t tensor_parallel = 1;     // TP: ranks that split each layer
  std::int64_t pipeline_parallel = 1;   // PP: ranks that split the layer stack
  std::int64_t context_parallel = 1;    // CP: ranks that split the sequence
  std::int64_t data_parallel = 1;       // DP: replicas; derived = world / (TP x PP x CP)
  std::int64_t world_size = 1;          // ranks in all (--world-size when planning)
  std::int64_t virtual_pipeline_stages = 1;  // interleaved 1F1B chunks per PP rank (1 = plain)
  // Megatron's uneven split (core/pipeline_layout.hpp): decoder layers on the first and on the last
  // pipeline stage (--decoder-first/last-pipeline-num-layers); 0 = not set, the even split.
  std::int64_t first_pipeline_stage_layers = 0;
  std::int64_t last_pipeline_stage_layers = 0;
  // Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding (the loss) counts as
  // one layer of the first (last) stage when the layers are split.
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  bool sequence_parallel = false;       // requires TP > 1
  bool use_distributed_optimizer = false;  // shard main params and Adam moments over DP
  // Megatron's overlap of the data-parallel exchanges with compute (production/trainer.hpp): the
  // gradient reduce-scatter per bucket during the last microbatch's backward, the weight
  // all-gather per bucket during the next forward. Throughput options: no result changes a bit.
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;    // requires the distributed optimizer and overlap_grad_reduce
  std::int64_t ddp_bucket_size = 0;     // --ddp-bucket-size; 0 = Megatron's default
};

// Activation recomputation (Megatron's --recompute-granularity, --recompute-method,
// --recompute-num-layers; Korthikanti et al. 2022). It changes what a layer's forward keeps for its
// backward, never a result: the recomputed forward is the same computation bit for bit.
enum class RecomputeGranularity {
  none,       // store every activation backward needs
  selective,  // recompute core attention (Megatron's default module, core_attn): tandem's
              // attention never stores its s x s scores, so this stores what `none` stores
  full,       // recompute whole layers (the method and number below)
};
enum class RecomputeMethod {
  uniform,  // each model chunk's layers in groups of num_layers (the last group may be shorter);
            // a group keeps only its input and is recomputed whole in backward
  block,    // the first num_layers layers of each model chunk keep only their inputs; the rest
            // store everything
};
struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::none;
  RecomputeMethod method = RecomputeMethod::uniform;  // used with full only
  std::int64_t num_layers = 0;                        // full: >= 1; else 0

  // Whether layer `local` (0-based within a model chunk of `chunk_layers` layers) keeps only its
  // input, and the first and one-past-last local layer of its recompute group (full only).
  bool recomputes(std::int64_t local) const;
  std::int64_t group_begin(std::int64_t local) const;
  std::int64_t group_end(std::int64_t local, std::int64_t chunk_layers) const;
  // The most layers rebuilt at once in backward (0 without full recompute).
  std::int64_t largest_group(std::int64_t chunk_layers) const;
};

// Megatron's gradient bucket size in parameters (DistributedDataParallelConfig.bucket_size):
// 0 (one bucket: the whole buffer) without overlap_grad_reduce; with it --ddp-bucket-size, or
// max(40,000,000, 1,000,000 x DP) when not given.
std::int64_t gradient_bucket_parameters(const ParallelConfig& parallel);

// A rank's slice of a bucket is whole blocks of this many elements: the production trainer's norm
// blocks (production/trainer.hpp kNormBlockElements), so the norm's order does not depend on DP.
inline constexpr std::int64_t kDataParallelAlignment = 1024;

// Elements of the flat buffer [begin, begin + elements) exchanged as one data-parallel bucket.
struct GradientBucket {
  std::int64_t begin = 0;
  std::int64_t elements = 0;  // a multiple of ranks x alignment, padding included
};

// The production trainer's buckets (production/sharding.hpp), one rule for it and the planner:
// buckets of `bucket_parameters` rounded up to a multiple of ranks x alignment, in flat order, the
// last one holding the rest padded to such a multiple (at least one bucket); bucket_parameters = 0:
// one bucket. `leading` > 0: the first `leading` elements are cut into buckets of their own (the
// same cut as the rest), so buffers that begin with the same leading elements give every rank the
// same slices of them (a tied embedding's two pipeline stages). Throws std::invalid_argument for a
// negative total, bucket size or leading count, or ranks or alignment below 1.
std::vector<GradientBucket> gradient_buckets(std::int64_t total, std::int64_t ranks, std::int64_t alignment,
                                             std::int64_t bucket_parameters, std::int64_t leading = 0);

struct BatchConfig {
  std::int64_t micro_batch_size = 1;    // samples per microbatch per replica
  std::int64_t global_batch_size = 8;   // samples per update = mbs x microbatches x DP
};

enum class LrDecayStyle { linear, cosine, constant };
enum class WeightDecayIncrStyle { constant, linear, cosine };

// SPEC 6: the clip coefficient is clip_grad / (norm + kClipNormEpsilon), applied when
// clip_grad < norm + kClipNormEpsilon (Megatron's clip_grad_norm_fp32). One constant for both twins,
// the audit and the harness.
inline constexpr double kClipNormEpsilon = 1e-6;

struct OptimizerConfig {
  double adam_beta1 = 0.9;              // first-moment decay, in [0, 1) (Megatron default)
  double adam_beta2 = 0.999;            // second-moment decay, in [0, 1) (Megatron default)
  double adam_eps = 1e-8;               // added to sqrt(v_hat), > 0 (SPEC 7)
  double clip_grad = 1.0;               // global-norm threshold; 0 disables clipping (SPEC 6)
  bool bf16 = false;                    // bf16 compute weights; main state stays fp32 (SPEC 7)
};

struct ScheduleConfig {
  double lr = 1e-3;                     // peak learning rate (max)
  double min_lr = 0.0;                  // floor after decay, 0 <= min_lr <= lr
  double lr_warmup_init = 0.0;          // lr of the very first update (SPEC 8)
  LrDecayStyle lr_decay_style = LrDecayStyle::linear;  // Megatron's default
  std::int64_t lr_warmup_samples = 0;   // W, samples; 0 = no warmup
  std::int64_t lr_decay_samples = 0;    // D, samples counted from 0 incl. warmup; default train
  std::int64_t train_samples = 0;       // samples to train (floor to whole updates)
  double weight_decay = 0.01;           // Megatron's default coefficient
  WeightDecayIncrStyle weight_decay_incr_style = WeightDecayIncrStyle::constant;
  double start_weight_decay = 0.01;     // = weight_decay for constant
  double end_weight_decay = 0.01;       // = weight_decay for constant
  std::int64_t wd_incr_samples = 0;     // span of the wd increment: train samples (Megatron)
};

enum class LossNormalization { per_token, microbatch_mean };
// sequential, shuffled: tandem's own orders (docs/DATA.md section 4); megatron: Megatron Core's
// GPTDataset and BlendedDataset order (core/data/megatron_order.hpp).
enum class DataOrder { sequential, shuffled, megatron };
enum class Packing { concat, units };

// One dataset named by --data-path (SPEC 2; blends: docs/DATA.md section 9).
struct DataPathEntry {
  std::string prefix;            // PREFIX of PREFIX.bin / PREFIX.idx
  // Normalized blend weight in (0, 1]; a blend's weights sum to 1. Absent when --data-path gave
  // no weights: one prefix, or Megatron's list of prefixes weighted by each dataset's size.
  std::optional<double> weight;
  bool operator==(const DataPathEntry&) const = default;
};

struct DataConfig {
  // --data-path: empty = the embedded corpus; one entry = that dataset; several = a blend
  // (Megatron's BlendedDataset, core/data/blend.hpp).
  std::vector<DataPathEntry> data_path;
  std::string split;                    // Megatron's "a,b,c"; empty = whole dataset trains
  DataOrder data_order = DataOrder::shuffled;  // SPEC 12 default
  Packing packing = Packing::concat;    // SPEC 2 default
  bool reset_position_ids = true;       // SPEC 3: on by default in tandem
  bool reset_attention_mask = true;     // SPEC 3: on by default in tandem
  bool eod_mask_loss = true;            // SPEC 3: on by default in tandem
  LossNormalization loss_normalization = LossNormalization::per_token;  // SPEC 5 default
  std::uint64_t seed = 1234;            // Megatron's default seed; feeds every random stream
  // --data-cache-path: a directory where --data-order megatron keeps its indices as files and
  // memory-maps them (Megatron's option; docs/DATA.md section 4). Empty = built in memory at
  // every start. Created when missing. The other orders have no index files and ignore it.
  std::string data_cache_path;
};

struct CheckpointConfig {
  std::string save;                     // directory to write checkpoints to; empty = none
  std::string load;                     // directory to resume from; empty = fresh start
  std::int64_t save_interval = 0;       // updates between checkpoints; 0 = only at the end
  bool override_opt_param_scheduler = false;  // allow changed optimizer/schedule on resume
};

// Validation during training (Megatron's --eval-interval, --eval-iters; docs/DATA.md section 12).
// Evaluation runs only when --split gives the validation part a weight > 0 and eval_iters > 0;
// build_run_config sets eval_iters to 0 otherwise, so evaluates() is the one test.
struct EvaluationConfig {
  // Iterations between evaluations: after iteration k when k % eval_interval == 0. 0 = none
  // during training (Megatron Core 0.19's default: unset); the end of training still evaluates.
  std::int64_t eval_interval = 0;
  // Global batches (of global_batch_size samples) of the validation split per evaluation. The
  // default is Megatron's 100; it takes effect only with a validation part in --split.
  std::int64_t eval_iters = 100;

  bool evaluates() const { return eval_iters > 0; }
};

// What a token-denominated request became after rounding to whole updates (SPEC 11: the budget
// rounds down, the warmup up). Absent when the run was given in samples or iterations.
struct TokenRounding {
  std::optional<double> requested_train_tokens;       // --train-tokens, as given
  std::optional<double> requested_lr_warmup_tokens;   // --lr-warmup-tokens, as given
};

struct RunConfig {
  ModelConfig model;
  ParallelConfig parallel;
  BatchConfig batch;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DataConfig data;
  TokenizerConfig tokenizer;
  CheckpointConfig checkpoint;
  EvaluationConfig evaluation;
  RecomputeConfig recompute;
  TokenRounding token_rounding;
  // What build_run_config changed or assumed where Megatron warns rather than refuses
  // ("--sequence-parallel with TP 1: turned off"); printed by plan, train and check, not saved.
  std::vector<std::string> argument_warnings;

  std::int64_t microbatches_per_replica() const {
    return batch.global_batch_size / (batch.micro_batch_size * parallel.data_parallel);
  }
  std::int64_t tokens_per_update() const { return batch.global_batch_size * model.seq_length; }
  std::int64_t train_updates() const { return schedule.train_samples / batch.global_batch_size; }
};

// Names used in logs and JSON.
std::string to_string(LrDecayStyle style);
std::string to_string(WeightDecayIncrStyle style);
std::string to_string(LossNormalization normalization);
std::string to_string(DataOrder order);
std::string to_string(Packing packing);
std::string to_string(TokenizerType type);  // Megatron's spelling; "bytes" for tandem's own
std::string to_string(RecomputeGranularity granularity);
std::string to_string(RecomputeMethod method);
std::optional<RecomputeGranularity> parse_recompute_granularity(const std::string& text);
std::optional<RecomputeMethod> parse_recompute_method(const std::string& text);

// The whole configuration as JSON (for log headers, checkpoints and `plan --json`).
void to_json(nlohmann::json& out, const RunConfig& config);

}  // namespace tandem
