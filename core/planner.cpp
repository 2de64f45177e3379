// The planner's arithmetic (core/planner.hpp): every number of SPEC 11 from a validated RunConfig,
// plus parameters by component and memory per GPU. docs/PLANNER.md states each formula. The plan's
// JSON and printed forms are in planner_output.cpp.
#include "core/planner.hpp"

#include <algorithm>
#include <cmath>

#include "core/model_layout.hpp"
#include "core/pipeline_layout.hpp"
#include "core/pipeline_schedule.hpp"
#include "core/run_layout.hpp"
#include "core/planner_format.hpp"
#include "core/schedule.hpp"

namespace tandem {
namespace {

using planner_format::fixed;
using planner_format::grouped;

constexpr double kBytesPerGib = 1024.0 * 1024.0 * 1024.0;  // GiB = 2^30 bytes
constexpr double kBf16Bytes = 2.0;
constexpr double kFp32Bytes = 4.0;
constexpr double kBubbleWarningFraction = 0.25;  // issue: warn when the bubble exceeds 25 %

std::int64_t ceil_div(std::int64_t numerator, std::int64_t denominator) {
  return (numerator + denominator - 1) / denominator;
}

// Parameters one TP rank of one decoder block holds. Column-parallel weights and biases (q, k, v,
// gate, up) and row-parallel weights (o, down) are split over TP; row-parallel biases and the
// norm weights are replicated (Megatron).
// With G < TP each key/value group is held whole by the TP/G ranks that share it (Megatron 0.19):
// a rank keeps k and v (and their biases) of one group, kv / G.
std::int64_t layer_parameters_per_gpu(const ParameterCount& count, const ModelConfig& model,
                                      std::int64_t tp) {
  const std::int64_t row_parallel_biases = model.add_bias_linear ? 2 * model.hidden_size : 0;
  const std::int64_t kv_biases = model.add_bias_linear ? 2 * model.kv_width() : 0;
  const std::int64_t key_value = count.attention_k + count.attention_v + kv_biases;
  const std::int64_t split = count.attention_q + count.attention_o + count.mlp_gate + count.mlp_up +
                             count.mlp_down + count.attention_biases + count.mlp_biases - row_parallel_biases -
                             kv_biases;
  // ceil: Megatron requires F divisible by TP; when it is not, count the larger shard.
  return ceil_div(split, tp) + ceil_div(key_value, std::min(tp, model.num_query_groups)) + row_parallel_biases +
         count.layer_norms;
}

// The tensors one GPU keeps for backward, per decoder block and microbatch, in elements: those
// of tandem's production model (production/model.hpp BlockActivations), and the softmax output
// a Megatron layer without flash attention keeps besides (docs/PLANNER.md "Activations").
struct LayerActivations {
  double compute_elements = 0;  // 16-bit with --bf16, else fp32
  double fp32_elements = 0;     // the norms' inverse RMS and attention's log-sum-exp (tandem)
  double score_elements = 0;    // H s^2 b / t (Megatron without flash attention)
  double block_input_elements = 0;  // what full recompute keeps
};

LayerActivations layer_activations(const RunConfig& config) {
  const ModelConfig& model = config.model;
  const ParallelConfig& parallel = config.parallel;
  const double tp = static_cast<double>(parallel.tensor_parallel);
  const double sequence_split = parallel.sequence_parallel ? tp : 1.0;  // SP shards these over TP
  const double full_sequence = static_cast<double>(model.seq_length);   // s
  const double local_sequence = full_sequence / static_cast<double>(parallel.context_parallel);
  const double tokens = local_sequence * static_cast<double>(config.batch.micro_batch_size);  // s b
  const double d = static_cast<double>(model.hidden_size);
  const double kv = static_cast<double>(model.kv_width());
  const double ffn = static_cast<double>(model.ffn_hidden_size);
  const double heads = static_cast<double>(model.num_attention_heads);
  LayerActivations layer;
  // Replicated over TP unless SP: the block input, the norm outputs before attention and MLP, and
  // the residual stream between them (4 s b d).
  layer.compute_elements = 4.0 * tokens * d / sequence_split;
  // Split over TP: q (s b d), k and v (2 s b kv), attention output (s b d), gate, up and their
  // SwiGLU product (3 s b F).
  layer.compute_elements += (2.0 * tokens * d + 3.0 * tokens * ffn) / tp;
  // k and v: kv / TP each, or with G < TP the one group a rank holds whole (kv / G).
  layer.compute_elements += 2.0 * tokens * kv / std::min(tp, static_cast<double>(model.num_query_groups));
  // fp32: two inverse RMS per position (stream rows), one log-sum-exp per position and head.
  layer.fp32_elements = 2.0 * tokens / sequence_split + tokens * heads / tp;
  // Softmax output of core attention: H x (s/c) x s per sample, split over TP.
  layer.score_elements = heads * tokens * full_sequence / tp;
  layer.block_input_elements = tokens * d / sequence_split;
  return layer;
}

// What tandem's trainer stores per layer and microbatch: its attention is flash-style (no s x s
// scores), so `selective` stores what `none` does; `full` keeps the block input only.
double activation_bytes_per_layer(const RunConfig& config, RecomputeGranularity recompute) {
  const double element_bytes = config.optimizer.bf16 ? kBf16Bytes : kFp32Bytes;
  const LayerActivations layer = layer_activations(config);
  if (recompute == RecomputeGranularity::full) return element_bytes * layer.block_input_elements;
  return element_bytes * layer.compute_elements + kFp32Bytes * layer.fp32_elements;
}

// Megatron's count for comparison (Korthikanti et al. 2022 adapted to SwiGLU + GQA, no dropout):
// without flash attention `none` also stores the H s^2 b softmax output; no fp32 statistics.
double megatron_activation_bytes_per_layer(const RunConfig& config, RecomputeGranularity recompute) {
  const double element_bytes = config.optimizer.bf16 ? kBf16Bytes : kFp32Bytes;
  const LayerActivations layer = layer_activations(config);
  switch (recompute) {
    case RecomputeGranularity::none: return element_bytes * (layer.compute_elements + layer.score_elements);
    case RecomputeGranularity::selective: return element_bytes * layer.compute_elements;
    case RecomputeGranularity::full: return element_bytes * layer.block_input_elements;
  }
  return 0.0;
}

// The production trainer's working buffers on one GPU that the plan's other terms do not count, by
// production/model.hpp's and trainer.hpp's allocations: each activation slot's inputs (token ids,
// labels, positions, attention starts, the loss mask, RoPE's cosines and sines); the residual
// stream, its branch and the final norm; one chunk of fp32 logits (and its bf16 gradient); one
// layer's backward scratch; tensor parallelism's exchange scratch; every microbatch's per-position
// loss; the pipeline's send and receive buffers. Bytes, for `in_flight` activation slots.
double working_bytes(const RunConfig& config, double in_flight) {
  const ModelConfig& model = config.model;
  const ParallelConfig& parallel = config.parallel;
  const double e = config.optimizer.bf16 ? kBf16Bytes : kFp32Bytes;
  const std::int64_t tp = parallel.tensor_parallel;
  const double t = static_cast<double>(tp);
  const double rows = static_cast<double>(model.seq_length / parallel.context_parallel * config.batch.micro_batch_size);
  const double stream = parallel.sequence_parallel ? rows / t : rows;
  const double d = static_cast<double>(model.hidden_size);
  const double hd = static_cast<double>(model.head_dim());
  const double query = d / t;
  const double kv = static_cast<double>(model.kv_width()) / std::min(t, static_cast<double>(model.num_query_groups));
  const double ffn = static_cast<double>(model.ffn_hidden_size) / t;
  const std::int64_t vocab = model.padded_vocab_size / tp;
  const double chunk = static_cast<double>(default_logits_chunk_rows(static_cast<std::int64_t>(rows), vocab));
  double bytes = in_flight * (rows * (4 * kFp32Bytes + 1) + rows * hd * kFp32Bytes);   // slot inputs
  bytes += 3 * stream * d * e + stream * kFp32Bytes;                                  // stream, branch, final norm
  bytes += chunk * static_cast<double>(vocab) * (kFp32Bytes + (config.optimizer.bf16 ? e : 0.0));  // logits
  bytes += (2 * stream * d + 2 * rows * query + 2 * rows * kv + 3 * rows * ffn) * e;  // backward scratch
  if (tp > 1) {
    if (parallel.sequence_parallel) bytes += rows * d * e + stream * d * kFp32Bytes;  // gathered, reduced
    bytes += rows * d * e + rows * d * kFp32Bytes;                                   // embedded, partial
    bytes += (3 * t + 2) * chunk * kFp32Bytes;                                        // cross-entropy stats
  }
  bytes += static_cast<double>(config.microbatches_per_replica()) * rows * kFp32Bytes;  // row losses
  if (parallel.pipeline_parallel > 1) bytes += 4 * stream * d * e;                      // [2] out, [2] in
  return bytes;
}

GradientExchange gradient_exchange(const ParallelConfig& parallel, std::int64_t parameters, double weight_bytes) {
  const std::int64_t dp = parallel.data_parallel;
  const std::vector<GradientBucket> buckets =
      gradient_buckets(parameters, dp, kDataParallelAlignment, gradient_bucket_parameters(parallel));
  GradientExchange exchange;
  exchange.buckets = static_cast<std::int64_t>(buckets.size());
  exchange.bucket_parameters = buckets.front().elements;
  exchange.slice_parameters = exchange.bucket_parameters / dp;
  const std::int64_t padded = buckets.back().begin + buckets.back().elements;
  const double sent = static_cast<double>(dp - 1) / static_cast<double>(dp) * static_cast<double>(padded);
  exchange.reduce_scatter_gib = sent * kFp32Bytes / kBytesPerGib;
  exchange.all_gather_gib = sent * (parallel.use_distributed_optimizer ? weight_bytes : kFp32Bytes) / kBytesPerGib;
  return exchange;
}

MemoryPlan plan_memory(const RunConfig& config, const PipelineStages& stages, const PlanOptions& options,
                       const ParameterCount& count) {
  const ModelConfig& model = config.model;
  const ParallelConfig& parallel = config.parallel;
  const std::int64_t tp = parallel.tensor_parallel;
  const std::int64_t pp = parallel.pipeline_parallel;
  const std::int64_t v = parallel.virtual_pipeline_stages;
  const std::int64_t microbatches = config.microbatches_per_replica();

  MemoryPlan memory;
  const RecomputeConfig& recompute = config.recompute;
  memory.recompute = recompute.granularity;
  memory.budget_gib = options.gpu_memory_gib;
  memory.activation_bytes_per_layer = activation_bytes_per_layer(config, recompute.granularity);
  memory.megatron_activation_bytes_per_layer = megatron_activation_bytes_per_layer(config, recompute.granularity);
  const double whole_layer_bytes = activation_bytes_per_layer(config, RecomputeGranularity::none);
  const double layer_input_bytes = activation_bytes_per_layer(config, RecomputeGranularity::full);
  // What one chunk slot keeps (production/model.hpp: one microbatch's pass through the stage's
  // largest model chunk; a recomputed group its input, every other layer everything), and the
  // layers a full recompute rebuilds at once in backward: that working set exists once, on top of
  // the stored inputs.
  auto stored_per_chunk_slot = [&](std::int64_t stage) {
    std::int64_t largest_chunk = 0;
    for (std::int64_t chunk = 0; chunk < v; ++chunk) {
      largest_chunk = std::max(largest_chunk, stages.layers(stage, chunk).size());
    }
    double bytes = 0.0;
    for (std::int64_t local = 0; local < largest_chunk; ++local) {
      if (!recompute.recomputes(local)) {
        bytes += whole_layer_bytes;
      } else if (recompute.group_begin(local) == local) {
        bytes += layer_input_bytes;
      }
    }
    return bytes;
  };
  auto recompute_working_bytes = [&](std::int64_t stage) {
    std::int64_t layers = 0;
    for (std::int64_t chunk = 0; chunk < v; ++chunk) {
      layers = std::max(layers, recompute.largest_group(stages.layers(stage, chunk).size()));
    }
    return static_cast<double>(layers) * whole_layer_bytes;
  };

  const std::int64_t layer_gpu = layer_parameters_per_gpu(count, model, tp);
  const std::int64_t vocab_matrix_gpu = model.padded_vocab_size * model.hidden_size / tp;
  const double weight_bytes = config.optimizer.bf16 ? kBf16Bytes : kFp32Bytes;
  // fp32 main params exist apart from the compute weights only with bf16; m and v always.
  const double optimizer_bytes = config.optimizer.bf16 ? 3.0 * kFp32Bytes : 2.0 * kFp32Bytes;
  const double optimizer_shards =
      parallel.use_distributed_optimizer ? static_cast<double>(parallel.data_parallel) : 1.0;

  // What a stage's schedule holds at once, counted on the schedule the trainer runs
  // (core/pipeline_schedule.hpp): (microbatch, chunk) pairs, whose layers' activations fill the
  // chunk slots (1F1B: min(p, m) on the first stage, one on the last; interleaved: Megatron's
  // warmup + 1, Korthikanti's p v (1 + (p - 1) / (p v)) on the first stage when m allows), and the
  // microbatches among them, whose inputs fill the activation slots. A layout whose interleaving
  // Megatron refuses (reported apart) is counted by Korthikanti's formula.
  struct InFlight {
    double chunk_slots = 1.0;
    double microbatches = 1.0;
  };
  auto in_flight = [&](std::int64_t stage) {
    InFlight held;
    if (v > 1 && !interleaved_schedule_problem(pp, microbatches).empty()) {
      held.chunk_slots = static_cast<double>(std::min(pp, microbatches)) *
                         (static_cast<double>(v) + static_cast<double>(pp - 1) / static_cast<double>(pp));
      if (stage == pp - 1) held.chunk_slots = static_cast<double>((v - 1) * pp + 1);
      held.microbatches = std::min(static_cast<double>(microbatches), held.chunk_slots);
      return held;
    }
    // Past 4 p microbatches (a multiple of p, as Megatron's rule keeps them) the steady state only
    // repeats: the counts are those of 4 p (PipelineSchedule test), and a seed-sized batch is
    // not written out.
    const std::int64_t counted = std::min(microbatches, 4 * pp);
    const std::vector<PipelinePass> passes =
        pp == 1  ? one_microbatch_at_a_time(1, counted)
        : v == 1 ? one_forward_one_backward(pp, stage, counted)
                 : interleaved_one_forward_one_backward(pp, stage, v, counted);
    held.chunk_slots = static_cast<double>(chunk_activation_slots(passes).count);
    held.microbatches = static_cast<double>(microbatches_in_flight(passes));
    return held;
  };

  auto stage_memory = [&](const std::string& name, bool first, bool last) {
    const std::int64_t layers_per_stage = stages.layers_on(first ? 0 : pp - 1);
    StageMemory stage;
    stage.stage = name;
    stage.parameters_per_gpu = layers_per_stage * layer_gpu;
    if (first) stage.parameters_per_gpu += vocab_matrix_gpu;  // embedding
    // The output layer; tied, the last stage keeps its own copy of the embedding (SPEC 6).
    if (last && (!model.tie_embeddings || !first)) stage.parameters_per_gpu += vocab_matrix_gpu;
    if (last) stage.parameters_per_gpu += model.hidden_size;  // final norm, replicated
    const double parameters = static_cast<double>(stage.parameters_per_gpu);
    stage.weights_gib = parameters * weight_bytes / kBytesPerGib;
    stage.main_grads_gib = parameters * kFp32Bytes / kBytesPerGib;
    stage.optimizer_state_gib = parameters * optimizer_bytes / optimizer_shards / kBytesPerGib;
    const std::int64_t stage_index = first ? 0 : pp - 1;
    const InFlight held = in_flight(stage_index);
    stage.activations_in_flight = held.chunk_slots / static_cast<double>(v);
    double activation_bytes = held.chunk_slots * stored_per_chunk_slot(stage_index);
    activation_bytes += recompute_working_bytes(stage_index);
    stage.activations_gib = activation_bytes / kBytesPerGib;
    stage.working_gib = working_bytes(config, held.microbatches) / kBytesPerGib;
    stage.total_gib = stage.weights_gib + stage.main_grads_gib + stage.optimizer_state_gib +
                      stage.activations_gib + stage.working_gib;
    stage.exchange = gradient_exchange(parallel, stage.parameters_per_gpu, weight_bytes);
    return stage;
  };
  if (pp == 1) {
    memory.stages.push_back(stage_memory("only", true, true));
  } else {
    memory.stages.push_back(stage_memory("first", true, false));
    memory.stages.push_back(stage_memory("last", false, true));
  }
  for (const auto& stage : memory.stages) memory.peak_gib = std::max(memory.peak_gib, stage.total_gib);
  return memory;
}

// The least recomputation that fits the budget, by the plan's own count: block with the fewest
// layers a chunk (the others store everything); when none fits, the uniform group size that needs
// the least memory, and by how much it misses.
std::string recompute_advice(const RunConfig& config, const PipelineStages& stages, const PlanOptions& options,
                             const ParameterCount& count) {
  const std::string selective_note = " (tandem's attention keeps no s x s scores, so selective saves nothing here)";
  RunConfig trial = config;
  trial.recompute.granularity = RecomputeGranularity::full;
  std::int64_t chunk_layers = 0;
  for (std::int64_t stage = 0; stage < stages.pipeline_size(); ++stage) {
    for (std::int64_t chunk = 0; chunk < stages.virtual_stages(); ++chunk) {
      chunk_layers = std::max(chunk_layers, stages.layers(stage, chunk).size());
    }
  }
  auto peak_with = [&](RecomputeMethod method, std::int64_t layers) {
    trial.recompute.method = method;
    trial.recompute.num_layers = layers;
    return plan_memory(trial, stages, options, count).peak_gib;
  };
  for (std::int64_t layers = 1; layers <= chunk_layers; ++layers) {
    const double peak = peak_with(RecomputeMethod::block, layers);
    if (peak <= options.gpu_memory_gib) {
      return "--recompute-granularity full --recompute-method block --recompute-num-layers " + std::to_string(layers) +
             " fits (" + fixed(peak, 1) + " GiB: the fewest recomputed layers that do)" + selective_note;
    }
  }
  std::int64_t best = 1;  // uniform groups: fewer kept inputs against a larger rebuilt group
  double least = peak_with(RecomputeMethod::uniform, 1);
  for (std::int64_t layers = 2; layers <= chunk_layers; ++layers) {
    if (const double peak = peak_with(RecomputeMethod::uniform, layers); peak < least) {
      least = peak;
      best = layers;
    }
  }
  return "even the least memory, --recompute-granularity full --recompute-method uniform --recompute-num-layers " +
         std::to_string(best) + ", needs " + fixed(least, 1) +
         " GiB: add TP or PP ranks, or shorten the sequence or microbatch" + selective_note;
}

LrMilestone milestone(const ScheduleConfig& schedule, std::string name, std::int64_t update,
                      std::int64_t gbs) {
  LrMilestone point;
  point.name = std::move(name);
  point.update = update;
  point.scheduler_samples = scheduler_samples_before_update(update, gbs);  // SPEC 8
  point.lr = learning_rate<double>(schedule, point.scheduler_samples);
  point.wd = weight_decay_at<double>(schedule, point.scheduler_samples);
  return point;
}

// The first update whose scheduler position reaches `samples`: (k - 1) x GBS >= samples.
std::int64_t first_update_at_or_after(std::int64_t samples, std::int64_t gbs) {
  return ceil_div(samples, gbs) + 1;
}

}  // namespace


std::int64_t causal_attention_pairs(std::int64_t seq_length) {
  return seq_length * (seq_length + 1) / 2;
}

double pipeline_bubble_fraction(std::int64_t pipeline_stages, std::int64_t microbatches,
                                std::int64_t virtual_stages) {
  const double fill_and_drain = static_cast<double>(pipeline_stages - 1);
  const double useful = static_cast<double>(virtual_stages * microbatches);
  return fill_and_drain / (useful + fill_and_drain);
}

ParameterCount count_parameters(const ModelConfig& model) {
  const std::int64_t d = model.hidden_size;
  const std::int64_t kv = model.kv_width();
  const std::int64_t ffn = model.ffn_hidden_size;
  const std::int64_t vocab = model.padded_vocab_size;
  ParameterCount count;
  count.embedding = vocab * d;
  count.attention_q = d * d;
  count.attention_k = d * kv;
  count.attention_v = d * kv;
  count.attention_o = d * d;
  count.attention_biases = model.add_bias_linear ? d + kv + kv + d : 0;
  count.mlp_gate = d * ffn;
  count.mlp_up = d * ffn;
  count.mlp_down = ffn * d;
  count.mlp_biases = model.add_bias_linear ? ffn + ffn + d : 0;
  count.layer_norms = 2 * d;
  count.per_layer = count.attention_q + count.attention_k + count.attention_v +
                    count.attention_o + count.attention_biases + count.mlp_gate + count.mlp_up +
                    count.mlp_down + count.mlp_biases + count.layer_norms;
  count.all_layers = model.num_layers * count.per_layer;
  count.final_norm = d;
  count.output_layer = model.tie_embeddings ? 0 : vocab * d;
  count.total = count.embedding + count.all_layers + count.final_norm + count.output_layer;
  return count;
}

Plan make_plan(const RunConfig& config, const PlanOptions& options) { return make_plan(config, RunLayout(config), options); }

Plan make_plan(const RunConfig& config, const RunLayout& layout, const PlanOptions& options) {
  const ParallelConfig& parallel = config.parallel;
  const ScheduleConfig& schedule = config.schedule;
  const std::int64_t gbs = config.batch.global_batch_size;
  const std::int64_t seq = config.model.seq_length;

  Plan plan;
  plan.config = config;
  plan.options = options;
  plan.warnings = config.argument_warnings;  // what the arguments' rules turned off or assumed

  plan.world_size = parallel.world_size;
  plan.data_parallel_size = parallel.data_parallel;
  plan.layout = "TP" + std::to_string(parallel.tensor_parallel) + " x PP" +
                std::to_string(parallel.pipeline_parallel) + " x CP" +
                std::to_string(parallel.context_parallel) + " x DP" +
                std::to_string(parallel.data_parallel) + " = " + grouped(parallel.world_size) +
                " GPUs";

  // SPEC 1: GBS = mbs x microbatches x DP; tokens = sequences x seq_length.
  plan.sequences_per_update = gbs;
  plan.tokens_per_update = config.tokens_per_update();
  plan.microbatches_per_replica = config.microbatches_per_replica();
  plan.virtual_pipeline_stages = parallel.virtual_pipeline_stages;
  plan.pipeline_bubble_fraction =
      pipeline_bubble_fraction(parallel.pipeline_parallel, plan.microbatches_per_replica,
                               parallel.virtual_pipeline_stages);
  // SPEC 11's comparison: half and double the microbatches at the same DP and mbs.
  std::vector<std::int64_t> alternatives;
  if (plan.microbatches_per_replica % 2 == 0) alternatives.push_back(plan.microbatches_per_replica / 2);
  alternatives.push_back(plan.microbatches_per_replica);
  alternatives.push_back(2 * plan.microbatches_per_replica);
  for (const std::int64_t microbatches : alternatives) {
    BubbleAlternative alternative;
    alternative.microbatches_per_replica = microbatches;
    alternative.global_batch_size =
        config.batch.micro_batch_size * microbatches * parallel.data_parallel;
    alternative.tokens_per_update = alternative.global_batch_size * seq;
    alternative.bubble_fraction = pipeline_bubble_fraction(
        parallel.pipeline_parallel, microbatches, parallel.virtual_pipeline_stages);
    plan.bubble_alternatives.push_back(alternative);
  }

  plan.attention_pairs_per_sequence = causal_attention_pairs(seq);
  if (seq % 2 == 0) plan.attention_pairs_by_length.push_back({seq / 2, causal_attention_pairs(seq / 2)});
  plan.attention_pairs_by_length.push_back({seq, plan.attention_pairs_per_sequence});

  // SPEC 2: floor(train_samples / GBS) updates; the remainder is reported, never trained.
  plan.total_updates = config.train_updates();
  plan.total_samples = plan.total_updates * gbs;
  plan.total_tokens = plan.total_samples * seq;
  plan.train_samples_remainder = schedule.train_samples % gbs;
  plan.warmup_samples = schedule.lr_warmup_samples;
  // Updates with n < W use a warmup lr below the peak: k - 1 < W / GBS.
  plan.warmup_updates = ceil_div(schedule.lr_warmup_samples, gbs);
  plan.warmup_tokens = schedule.lr_warmup_samples * seq;
  plan.decay_samples = schedule.lr_decay_samples;

  if (config.token_rounding.requested_train_tokens) {
    plan.requested_train_tokens = config.token_rounding.requested_train_tokens;
    plan.budget_shortfall_tokens =
        std::llround(*plan.requested_train_tokens) - plan.total_tokens;  // SPEC 11: rounds down
  }
  if (config.token_rounding.requested_lr_warmup_tokens) {
    plan.requested_warmup_tokens = config.token_rounding.requested_lr_warmup_tokens;
    plan.warmup_excess_tokens =
        plan.warmup_tokens - std::llround(*plan.requested_warmup_tokens);  // SPEC 11: rounds up
  }

  // SPEC 8 milestones, each at the lr the update uses.
  const std::int64_t last_update = std::max<std::int64_t>(plan.total_updates, 1);
  plan.decay_midpoint_samples =
      schedule.lr_warmup_samples + (schedule.lr_decay_samples - schedule.lr_warmup_samples) / 2;
  plan.lr_milestones.push_back(milestone(schedule, "first_update", 1, gbs));
  plan.lr_milestones.push_back(milestone(
      schedule, "end_of_warmup", first_update_at_or_after(schedule.lr_warmup_samples, gbs), gbs));
  plan.lr_milestones.push_back(milestone(
      schedule, "decay_midpoint", first_update_at_or_after(plan.decay_midpoint_samples, gbs), gbs));
  plan.lr_milestones.push_back(milestone(schedule, "last_update", last_update, gbs));
  plan.lr_at_decay_midpoint = learning_rate<double>(schedule, plan.decay_midpoint_samples);
  // SPEC 7: the decoupled decay multiplies p by 1 - lr x wd; at the peak lr = --lr.
  plan.decay_multiplier_at_peak =
      1.0 - schedule.lr * weight_decay_at<double>(schedule, schedule.lr_warmup_samples);

  plan.parameters = count_parameters(config.model);
  plan.memory = plan_memory(config, layout.stages, options, plan.parameters);

  // Warnings.
  const bool loss_masked = config.data.eod_mask_loss || config.data.packing == Packing::units;
  if (config.data.loss_normalization == LossNormalization::microbatch_mean && loss_masked) {
    plan.warnings.push_back(
        "--loss-normalization microbatch-mean with loss masking on: microbatches carry different "
        "numbers of loss tokens, so the gradients depend on the microbatch split (SPEC 5); "
        "per-token normalization is split-invariant");
  }
  if (plan.memory.peak_gib > options.gpu_memory_gib) {
    plan.warnings.push_back("memory: the peak stage needs " + fixed(plan.memory.peak_gib, 1) +
                            " GiB per GPU, over the --gpu-memory-gib budget of " +
                            fixed(options.gpu_memory_gib, 1) + " GiB; " +
                            recompute_advice(config, layout.stages, options, plan.parameters));
  }
  if (plan.pipeline_bubble_fraction > kBubbleWarningFraction) {
    plan.warnings.push_back("pipeline bubble " + fixed(100.0 * plan.pipeline_bubble_fraction, 1) +
                            " % is over 25 %; more microbatches per replica or an interleaved "
                            "schedule lowers it");
  }
  if (plan.train_samples_remainder > 0) {
    plan.warnings.push_back("--train-samples " + grouped(schedule.train_samples) +
                            " is not a multiple of the global batch " + grouped(gbs) + ": " +
                            grouped(plan.train_samples_remainder) +
                            " samples are never trained (SPEC 2)");
  }
  return plan;
}


}  // namespace tandem
