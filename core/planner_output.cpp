// The planner's output (core/planner.hpp): a Plan as JSON (tandem plan --json) and as the printed
// table of tandem plan, and the number formatting the planner's text shares (planner_format.hpp).
#include "core/planner.hpp"

#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/planner_format.hpp"

namespace tandem {

namespace planner_format {

std::string grouped(std::int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  const auto length = static_cast<std::int64_t>(digits.size());
  for (std::int64_t i = 0; i < length; ++i) {
    if (i > 0 && (length - i) % 3 == 0) out += ',';
    out += digits[static_cast<std::size_t>(i)];
  }
  return value < 0 ? "-" + out : out;
}

std::string fixed(double value, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

}  // namespace planner_format

namespace {

using planner_format::fixed;
using planner_format::grouped;

std::string general(double value) {
  std::ostringstream out;
  out << std::setprecision(6) << value;
  return out.str();
}

}  // namespace

void to_json(nlohmann::json& out, const Plan& plan) {
  using nlohmann::json;
  auto optional_number = [](const auto& value) -> json {
    return value ? json(*value) : json(nullptr);
  };
  json milestones = json::array();
  for (const auto& point : plan.lr_milestones) {
    milestones.push_back({{"name", point.name},
                          {"update", point.update},
                          {"scheduler_samples", point.scheduler_samples},
                          {"lr", point.lr},
                          {"wd", point.wd}});
  }
  json bubbles = json::array();
  for (const auto& alternative : plan.bubble_alternatives) {
    bubbles.push_back({{"microbatches_per_replica", alternative.microbatches_per_replica},
                       {"global_batch_size", alternative.global_batch_size},
                       {"tokens_per_update", alternative.tokens_per_update},
                       {"bubble_fraction", alternative.bubble_fraction}});
  }
  json pairs = json::array();
  for (const auto& entry : plan.attention_pairs_by_length) {
    pairs.push_back({{"seq_length", entry.seq_length}, {"causal_pairs", entry.causal_pairs}});
  }
  const ParameterCount& p = plan.parameters;
  json stages = json::array();
  for (const auto& stage : plan.memory.stages) {
    stages.push_back({{"stage", stage.stage},
                      {"parameters_per_gpu", stage.parameters_per_gpu},
                      {"weights_gib", stage.weights_gib},
                      {"main_grads_gib", stage.main_grads_gib},
                      {"optimizer_state_gib", stage.optimizer_state_gib},
                      {"activations_in_flight", stage.activations_in_flight},
                      {"activations_gib", stage.activations_gib},
                      {"working_gib", stage.working_gib},
                      {"total_gib", stage.total_gib},
                      {"dp_exchange", {{"buckets", stage.exchange.buckets},
                                       {"bucket_parameters", stage.exchange.bucket_parameters},
                                       {"slice_parameters", stage.exchange.slice_parameters},
                                       {"reduce_scatter_gib_sent_per_update", stage.exchange.reduce_scatter_gib},
                                       {"all_gather_gib_sent_per_update", stage.exchange.all_gather_gib}}}});
  }
  json config;
  to_json(config, plan.config);

  out = json{
      {"world_size", plan.world_size},
      {"data_parallel_size", plan.data_parallel_size},
      {"layout", plan.layout},
      {"sequences_per_update", plan.sequences_per_update},
      {"tokens_per_update", plan.tokens_per_update},
      {"microbatches_per_replica", plan.microbatches_per_replica},
      {"virtual_pipeline_stages", plan.virtual_pipeline_stages},
      {"pipeline_bubble_fraction", plan.pipeline_bubble_fraction},
      {"pipeline_bubble_alternatives", bubbles},
      {"attention_pairs_per_sequence", plan.attention_pairs_per_sequence},
      {"attention_pairs_by_seq_length", pairs},
      {"total_updates", plan.total_updates},
      {"total_samples", plan.total_samples},
      {"total_tokens", plan.total_tokens},
      {"train_samples_remainder", plan.train_samples_remainder},
      {"warmup_samples", plan.warmup_samples},
      {"warmup_updates", plan.warmup_updates},
      {"warmup_tokens", plan.warmup_tokens},
      {"decay_samples", plan.decay_samples},
      {"requested_train_tokens", optional_number(plan.requested_train_tokens)},
      {"budget_shortfall_tokens", optional_number(plan.budget_shortfall_tokens)},
      {"requested_warmup_tokens", optional_number(plan.requested_warmup_tokens)},
      {"warmup_excess_tokens", optional_number(plan.warmup_excess_tokens)},
      {"lr_decay_style", to_string(plan.config.schedule.lr_decay_style)},
      {"weight_decay_incr_style", to_string(plan.config.schedule.weight_decay_incr_style)},
      {"lr_milestones", milestones},
      {"decay_midpoint_samples", plan.decay_midpoint_samples},
      {"lr_at_decay_midpoint", plan.lr_at_decay_midpoint},
      {"decay_multiplier_at_peak", plan.decay_multiplier_at_peak},
      {"parameters",
       {{"embedding", p.embedding},
        {"per_layer",
         {{"attention_q", p.attention_q},
          {"attention_k", p.attention_k},
          {"attention_v", p.attention_v},
          {"attention_o", p.attention_o},
          {"attention_biases", p.attention_biases},
          {"mlp_gate", p.mlp_gate},
          {"mlp_up", p.mlp_up},
          {"mlp_down", p.mlp_down},
          {"mlp_biases", p.mlp_biases},
          {"layer_norms", p.layer_norms},
          {"total", p.per_layer}}},
        {"num_layers", plan.config.model.num_layers},
        {"all_layers", p.all_layers},
        {"final_norm", p.final_norm},
        {"output_layer", p.output_layer},
        {"padded_vocab_size", plan.config.model.padded_vocab_size},
        {"total", p.total}}},
      {"memory_per_gpu",
       {{"recompute_granularity", to_string(plan.memory.recompute)},
        {"recompute_method", plan.memory.recompute == RecomputeGranularity::full
                                 ? nlohmann::json(to_string(plan.config.recompute.method))
                                 : nlohmann::json(nullptr)},
        {"recompute_num_layers", plan.memory.recompute == RecomputeGranularity::full
                                     ? nlohmann::json(plan.config.recompute.num_layers)
                                     : nlohmann::json(nullptr)},
        {"activation_bytes_per_layer", plan.memory.activation_bytes_per_layer},
        {"megatron_activation_bytes_per_layer", plan.memory.megatron_activation_bytes_per_layer},
        {"stages", stages},
        {"peak_gib", plan.memory.peak_gib},
        {"budget_gib", plan.memory.budget_gib}}},
      {"warnings", plan.warnings},
      {"config", config},
  };
}

void print_plan(std::ostream& out, const Plan& plan) {
  const RunConfig& config = plan.config;
  auto row = [&out](const std::string& label, const std::string& value) {
    out << "  " << std::left << std::setw(38) << label << value << "\n";
  };
  auto percent = [](double fraction) { return fixed(100.0 * fraction, 1) + " %"; };
  const std::int64_t seq = config.model.seq_length;

  out << "tandem plan\n\nLayout\n";
  row("layout", plan.layout);
  row("world size (GPUs)", grouped(plan.world_size));
  row("data-parallel replicas", grouped(plan.data_parallel_size));

  out << "\nBatch (SPEC 1)\n";
  row("micro batch size (samples)", grouped(config.batch.micro_batch_size));
  row("microbatches per replica", grouped(plan.microbatches_per_replica));
  row("sequences per update", grouped(plan.sequences_per_update));
  row("sequence length (tokens)", grouped(seq));
  row("tokens per update", grouped(plan.tokens_per_update));

  out << "\nPipeline (p = " << config.parallel.pipeline_parallel
      << ", v = " << plan.virtual_pipeline_stages << "; bubble = (p-1)/(v m + p-1))\n";
  for (const auto& alternative : plan.bubble_alternatives) {
    const bool current = alternative.microbatches_per_replica == plan.microbatches_per_replica;
    row("m = " + grouped(alternative.microbatches_per_replica) + (current ? " (this run)" : ""),
        percent(alternative.bubble_fraction) + "   (" + grouped(alternative.global_batch_size) +
            " sequences, " + grouped(alternative.tokens_per_update) + " tokens per update)");
  }

  out << "\nAttention (causal pairs L(L+1)/2 per sequence)\n";
  for (const auto& entry : plan.attention_pairs_by_length) {
    row("L = " + grouped(entry.seq_length), grouped(entry.causal_pairs));
  }

  out << "\nData (SPEC 2; docs/DATA.md)\n";
  const auto& data_path = config.data.data_path;
  if (data_path.empty()) {
    row("dataset", "the embedded default corpus");
  } else if (data_path.size() == 1) {
    row("dataset", data_path.front().prefix);
  } else {
    const bool weighted = data_path.front().weight.has_value();
    row("blend of " + grouped(static_cast<std::int64_t>(data_path.size())) + " datasets",
        weighted ? "weights given, normalized; sample i from the dataset furthest behind its share"
                 : "weighted by each dataset's samples per epoch (fixed when they open)");
    for (const auto& entry : data_path) {
      row(weighted ? "  weight " + general(*entry.weight) : "  dataset", entry.prefix);
    }
  }
  row("split", config.data.split.empty() ? "all documents train" : config.data.split);
  const EvaluationConfig& evaluation = config.evaluation;
  if (!evaluation.evaluates()) {
    row("validation (--eval-*)",
        "none (needs a validation part in --split and --eval-iters > 0)");
  } else {
    row("validation (--eval-*)",
        grouped(evaluation.eval_iters) + " batches = " +
            grouped(evaluation.eval_iters * config.batch.global_batch_size) + " samples " +
            (evaluation.eval_interval > 0
                 ? "every " + grouped(evaluation.eval_interval) + " updates and at the end"
                 : "at the end only"));
  }

  out << "\nTraining length (SPEC 2, 11)\n";
  row("updates", grouped(plan.total_updates));
  row("samples", grouped(plan.total_samples));
  row("tokens", grouped(plan.total_tokens));
  if (plan.requested_train_tokens) {
    row("requested tokens (--train-tokens)", grouped(std::llround(*plan.requested_train_tokens)));
    row("short of the request (rounded down)", grouped(*plan.budget_shortfall_tokens));
  }
  row("train-samples remainder", grouped(plan.train_samples_remainder));

  out << "\nSchedule (SPEC 8: update k uses lr((k-1) x GBS))\n";
  row("lr decay style", to_string(config.schedule.lr_decay_style));
  row("weight decay style", to_string(config.schedule.weight_decay_incr_style));
  row("warmup samples", grouped(plan.warmup_samples));
  row("warmup updates", grouped(plan.warmup_updates));
  row("warmup tokens", grouped(plan.warmup_tokens));
  if (plan.requested_warmup_tokens) {
    row("requested warmup (--lr-warmup-tokens)",
        grouped(std::llround(*plan.requested_warmup_tokens)));
    row("over the request (rounded up)", grouped(*plan.warmup_excess_tokens));
  }
  row("decay samples", grouped(plan.decay_samples));
  for (const auto& point : plan.lr_milestones) {
    row(point.name + " (update " + grouped(point.update) + ")",
        "lr " + general(point.lr) + ", wd " + general(point.wd) + " at " +
            grouped(point.scheduler_samples) + " samples");
  }
  row("lr halfway through decay", general(plan.lr_at_decay_midpoint) + " at " +
                                      grouped(plan.decay_midpoint_samples) + " samples");
  row("decay multiplier at peak (1-lr wd)", fixed(plan.decay_multiplier_at_peak, 6));

  const ParameterCount& p = plan.parameters;
  out << "\nParameters (padded vocabulary " << grouped(config.model.padded_vocab_size) << ")\n";
  row("embedding", grouped(p.embedding));
  row("per layer: attention q/k/v/o",
      grouped(p.attention_q) + " / " + grouped(p.attention_k) + " / " + grouped(p.attention_v) +
          " / " + grouped(p.attention_o));
  if (config.model.add_bias_linear) {
    row("per layer: biases (attention, MLP)",
        grouped(p.attention_biases) + ", " + grouped(p.mlp_biases));
  }
  row("per layer: MLP gate/up/down",
      grouped(p.mlp_gate) + " / " + grouped(p.mlp_up) + " / " + grouped(p.mlp_down));
  row("per layer: two norms", grouped(p.layer_norms));
  row("per layer", grouped(p.per_layer));
  row("all " + grouped(config.model.num_layers) + " layers", grouped(p.all_layers));
  row("final norm", grouped(p.final_norm));
  row("output layer", config.model.tie_embeddings ? "tied to the embedding"
                                                  : grouped(p.output_layer));
  row("total", grouped(p.total) + " (" + fixed(static_cast<double>(p.total) / 1e9, 2) + " B)");

  const MemoryPlan& memory = plan.memory;
  const std::string recompute_method =
      memory.recompute == RecomputeGranularity::full
          ? " " + to_string(config.recompute.method) + " " + std::to_string(config.recompute.num_layers)
          : "";
  out << "\nMemory per GPU, GiB (recompute " << to_string(memory.recompute) << recompute_method << ", "
      << (config.optimizer.bf16 ? "bf16" : "fp32") << " weights"
      << (config.parallel.use_distributed_optimizer ? ", distributed optimizer" : "") << ")\n";
  for (const auto& stage : memory.stages) {
    row(stage.stage + " stage: parameters", grouped(stage.parameters_per_gpu));
    row(stage.stage + " stage: weights", fixed(stage.weights_gib, 2));
    row(stage.stage + " stage: fp32 main grads", fixed(stage.main_grads_gib, 2));
    row(stage.stage + " stage: optimizer state", fixed(stage.optimizer_state_gib, 2));
    row(stage.stage + " stage: activations",
        fixed(stage.activations_gib, 2) + " (" + fixed(stage.activations_in_flight, 2) +
            " microbatches in flight)");
    row(stage.stage + " stage: working buffers", fixed(stage.working_gib, 2));
    row(stage.stage + " stage: total", fixed(stage.total_gib, 2));
  }
  row("peak vs budget", fixed(memory.peak_gib, 2) + " of " + fixed(memory.budget_gib, 2));
  row("activations per layer, MiB", fixed(memory.activation_bytes_per_layer / (1024.0 * 1024.0), 2) +
                                        " (tandem's flash-style attention; Megatron without flash attention: " +
                                        fixed(memory.megatron_activation_bytes_per_layer / (1024.0 * 1024.0), 2) + ")");

  const ParallelConfig& parallel = config.parallel;
  out << "\nData-parallel exchange per GPU and update (" << grouped(parallel.data_parallel) << " replicas; "
      << (parallel.overlap_grad_reduce ? "buckets reduced during the backward" : "one bucket, after the backward")
      << (parallel.overlap_param_gather ? ", weights gathered during the forward" : "") << ")\n";
  for (const auto& stage : memory.stages) {
    const GradientExchange& exchange = stage.exchange;
    row(stage.stage + " stage: gradient buckets",
        grouped(exchange.buckets) + " x " + grouped(exchange.bucket_parameters) + " parameters (slice " +
            grouped(exchange.slice_parameters) + " per rank)");
    row(stage.stage + " stage: GiB sent",
        fixed(exchange.reduce_scatter_gib, 2) + " fp32 gradient reduce-scatter + " + fixed(exchange.all_gather_gib, 2) +
            (parallel.use_distributed_optimizer ? " weight" : " gradient") + " all-gather");
  }

  out << "\nWarnings\n";
  if (plan.warnings.empty()) out << "  none\n";
  for (const auto& warning : plan.warnings) out << "  warning: " << warning << "\n";
}

}  // namespace tandem
