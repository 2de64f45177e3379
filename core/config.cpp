// Names and JSON form of the validated configuration (core/config.hpp).
#include "core/config.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem {

std::int64_t gradient_bucket_parameters(const ParallelConfig& parallel) {
  if (!parallel.overlap_grad_reduce) return 0;
  if (parallel.ddp_bucket_size > 0) return parallel.ddp_bucket_size;
  return std::max<std::int64_t>(40'000'000, 1'000'000 * parallel.data_parallel);
}

std::vector<GradientBucket> gradient_buckets(std::int64_t total, std::int64_t ranks, std::int64_t alignment,
                                             std::int64_t bucket_parameters, std::int64_t leading) {
  if (total < 0 || ranks < 1 || alignment < 1 || bucket_parameters < 0 || leading < 0) {
    throw std::invalid_argument("gradient_buckets: total " + std::to_string(total) + ", ranks " +
                                std::to_string(ranks) + ", alignment " + std::to_string(alignment) +
                                ", bucket parameters " + std::to_string(bucket_parameters) + ", leading " +
                                std::to_string(leading));
  }
  const std::int64_t unit = ranks * alignment;
  const auto round_up = [unit](std::int64_t elements) {
    return std::max<std::int64_t>(1, (elements + unit - 1) / unit) * unit;
  };
  const std::int64_t bucket = round_up(bucket_parameters == 0 ? total : bucket_parameters);
  std::vector<GradientBucket> buckets;
  std::int64_t begin = 0;
  // Buckets from `begin` until `end` is covered (at least one when none exists yet).
  const auto cut = [&](std::int64_t end) {
    while (begin < end || buckets.empty()) {
      const std::int64_t elements = std::min(bucket, round_up(end - begin));
      buckets.push_back(GradientBucket{begin, elements});
      begin += elements;
    }
  };
  if (leading > 0) cut(std::min(leading, total));
  cut(total);
  return buckets;
}

std::string to_string(LrDecayStyle style) {
  switch (style) {
    case LrDecayStyle::linear: return "linear";
    case LrDecayStyle::cosine: return "cosine";
    case LrDecayStyle::constant: return "constant";
  }
  return "?";
}

std::string to_string(WeightDecayIncrStyle style) {
  switch (style) {
    case WeightDecayIncrStyle::constant: return "constant";
    case WeightDecayIncrStyle::linear: return "linear";
    case WeightDecayIncrStyle::cosine: return "cosine";
  }
  return "?";
}

std::string to_string(LossNormalization normalization) {
  return normalization == LossNormalization::per_token ? "per-token" : "microbatch-mean";
}

std::string to_string(DataOrder order) {
  switch (order) {
    case DataOrder::sequential: return "sequential";
    case DataOrder::shuffled: return "shuffled";
    case DataOrder::megatron: return "megatron";
  }
  return "?";
}

std::string to_string(Packing packing) { return packing == Packing::concat ? "concat" : "units"; }

std::string to_string(TokenizerType type) {
  switch (type) {
    case TokenizerType::bytes: return "bytes";
    case TokenizerType::gpt2_bpe: return "GPT2BPETokenizer";
    case TokenizerType::huggingface: return "HuggingFaceTokenizer";
    case TokenizerType::sentencepiece: return "SentencePieceTokenizer";
    case TokenizerType::llama2: return "Llama2Tokenizer";
    case TokenizerType::null_tokenizer: return "NullTokenizer";
  }
  return "unknown";
}

std::string to_string(RecomputeGranularity granularity) {
  switch (granularity) {
    case RecomputeGranularity::none: return "none";
    case RecomputeGranularity::selective: return "selective";
    case RecomputeGranularity::full: return "full";
  }
  return "unknown";
}

std::string to_string(RecomputeMethod method) { return method == RecomputeMethod::uniform ? "uniform" : "block"; }

std::optional<RecomputeGranularity> parse_recompute_granularity(const std::string& text) {
  if (text == "none") return RecomputeGranularity::none;
  if (text == "selective") return RecomputeGranularity::selective;
  if (text == "full") return RecomputeGranularity::full;
  return std::nullopt;
}

std::optional<RecomputeMethod> parse_recompute_method(const std::string& text) {
  if (text == "uniform") return RecomputeMethod::uniform;
  if (text == "block") return RecomputeMethod::block;
  return std::nullopt;
}

// Megatron's TransformerBlock._checkpointed_forward, per model chunk: uniform checkpoints groups
// [i, min(i + n, layers)) for i = 0, n, 2n, ...; block checkpoints layers 0 .. n-1 one by one.
bool RecomputeConfig::recomputes(std::int64_t local) const {
  if (granularity != RecomputeGranularity::full) return false;
  return method == RecomputeMethod::uniform || local < num_layers;
}

std::int64_t RecomputeConfig::group_begin(std::int64_t local) const {
  return method == RecomputeMethod::uniform ? local - local % num_layers : local;
}

std::int64_t RecomputeConfig::group_end(std::int64_t local, std::int64_t chunk_layers) const {
  return method == RecomputeMethod::uniform ? std::min(group_begin(local) + num_layers, chunk_layers) : local + 1;
}

std::int64_t RecomputeConfig::largest_group(std::int64_t chunk_layers) const {
  if (granularity != RecomputeGranularity::full || chunk_layers == 0) return 0;
  return method == RecomputeMethod::uniform ? std::min(num_layers, chunk_layers) : 1;
}

namespace {

// --data-path: "" for the embedded corpus and "PREFIX" for one dataset without a weight (the
// form logs, checkpoints and the golden fixtures have always held); a blend (or one weighted
// prefix) as [{"prefix": P, "weight": W or null}, ...].
nlohmann::json data_path_json(const std::vector<DataPathEntry>& entries) {
  if (entries.empty()) return "";
  if (entries.size() == 1 && !entries.front().weight) return entries.front().prefix;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& entry : entries) {
    out.push_back({{"prefix", entry.prefix},
                   {"weight", entry.weight ? nlohmann::json(*entry.weight) : nlohmann::json()}});
  }
  return out;
}

}  // namespace

void to_json(nlohmann::json& out, const RunConfig& config) {
  const auto& m = config.model;
  const auto& p = config.parallel;
  const auto& b = config.batch;
  const auto& o = config.optimizer;
  const auto& s = config.schedule;
  const auto& d = config.data;
  const auto& c = config.checkpoint;
  out = nlohmann::json{
      {"model",
       {{"num_layers", m.num_layers}, {"hidden_size", m.hidden_size},
        {"ffn_hidden_size", m.ffn_hidden_size}, {"num_attention_heads", m.num_attention_heads},
        {"num_query_groups", m.num_query_groups}, {"vocab_size", m.vocab_size},
        {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
        {"padded_vocab_size", m.padded_vocab_size}, {"seq_length", m.seq_length},
        {"add_bias_linear", m.add_bias_linear}, {"tie_embeddings", m.tie_embeddings},
        {"rotary_base", m.rotary_base}, {"norm_epsilon", m.norm_epsilon},
        {"init_method_std", m.init_method_std}}},
      {"parallel",
       {{"tensor_parallel", p.tensor_parallel}, {"pipeline_parallel", p.pipeline_parallel},
        {"context_parallel", p.context_parallel}, {"data_parallel", p.data_parallel},
        {"world_size", p.world_size}, {"virtual_pipeline_stages", p.virtual_pipeline_stages},
        {"sequence_parallel", p.sequence_parallel},
        {"use_distributed_optimizer", p.use_distributed_optimizer},
        {"overlap_grad_reduce", p.overlap_grad_reduce},
        {"overlap_param_gather", p.overlap_param_gather},
        {"ddp_bucket_size", p.ddp_bucket_size}}},
      {"batch",
       {{"micro_batch_size", b.micro_batch_size}, {"global_batch_size", b.global_batch_size},
        {"microbatches_per_replica", config.microbatches_per_replica()}}},
      {"optimizer",
       {{"adam_beta1", o.adam_beta1}, {"adam_beta2", o.adam_beta2}, {"adam_eps", o.adam_eps},
        {"clip_grad", o.clip_grad}, {"bf16", o.bf16}}},
      {"schedule",
       {{"lr", s.lr}, {"min_lr", s.min_lr}, {"lr_warmup_init", s.lr_warmup_init},
        {"lr_decay_style", to_string(s.lr_decay_style)},
        {"lr_warmup_samples", s.lr_warmup_samples}, {"lr_decay_samples", s.lr_decay_samples},
        {"train_samples", s.train_samples}, {"weight_decay", s.weight_decay},
        {"weight_decay_incr_style", to_string(s.weight_decay_incr_style)},
        {"start_weight_decay", s.start_weight_decay}, {"end_weight_decay", s.end_weight_decay},
        {"wd_incr_samples", s.wd_incr_samples}}},
      {"data",
       {{"data_path", data_path_json(d.data_path)}, {"split", d.split}, {"data_order", to_string(d.data_order)},
        {"packing", to_string(d.packing)}, {"reset_position_ids", d.reset_position_ids},
        {"reset_attention_mask", d.reset_attention_mask}, {"eod_mask_loss", d.eod_mask_loss},
        {"loss_normalization", to_string(d.loss_normalization)}, {"seed", d.seed}}},
      {"checkpoint",
       {{"save", c.save}, {"load", c.load}, {"save_interval", c.save_interval},
        {"override_opt_param_scheduler", c.override_opt_param_scheduler}}},
  };
  // Megatron's uneven pipeline split, only when asked for (every other configuration reads as it
  // always has: log headers, checkpoints, the golden fixtures).
  if (p.first_pipeline_stage_layers > 0) out["parallel"]["first_pipeline_stage_layers"] = p.first_pipeline_stage_layers;
  if (p.last_pipeline_stage_layers > 0) out["parallel"]["last_pipeline_stage_layers"] = p.last_pipeline_stage_layers;
  if (p.account_for_embedding_in_pipeline_split) out["parallel"]["account_for_embedding_in_pipeline_split"] = true;
  if (p.account_for_loss_in_pipeline_split) out["parallel"]["account_for_loss_in_pipeline_split"] = true;
  // Only a run that caches Megatron's indices records where (log headers and checkpoints of every
  // other run read as they always have).
  if (!d.data_cache_path.empty()) out["data"]["data_cache_path"] = d.data_cache_path;
  // Only a run that names a tokenizer records it, so the byte tokenizer's runs (log headers,
  // checkpoints, the golden fixtures) read as they always have; an absent "tokenizer" means the
  // byte tokenizer's ids, EOD 256 and PAD 257 (docs/DATA.md section 13).
  if (config.tokenizer.named()) {
    const auto& t = config.tokenizer;
    out["tokenizer"] = {{"type", to_string(t.type)}, {"vocab_file", t.vocab_file},
                        {"merge_file", t.merge_file}, {"tokenizer_model", t.tokenizer_model},
                        {"vocab_size", m.vocab_size}, {"eod", t.eod_token},
                        {"pad", t.pad_token == kNoPadToken ? nlohmann::json(nullptr) : nlohmann::json(t.pad_token)}};
  }
  // Only a run that recomputes records how (every other run's configuration reads as it always has).
  if (config.recompute.granularity != RecomputeGranularity::none) {
    out["recompute"] = {{"granularity", to_string(config.recompute.granularity)}};
    if (config.recompute.granularity == RecomputeGranularity::full) {
      out["recompute"]["method"] = to_string(config.recompute.method);
      out["recompute"]["num_layers"] = config.recompute.num_layers;
    }
  }
  // Only a run that evaluates records its evaluation settings, so the configuration of every
  // other run (log headers, checkpoints, the golden fixtures) reads as it always has.
  if (config.evaluation.evaluates()) {
    out["evaluation"] = {{"eval_interval", config.evaluation.eval_interval},
                         {"eval_iters", config.evaluation.eval_iters},
                         {"split", "valid"}};
  }
}

}  // namespace tandem
