// The parallel layout's and the batch's rules (Megatron's arguments.py): TP, PP, CP and DP, the
// architecture's divisibility by them, sequence parallelism and the overlap options, the
// interleaved pipeline split, the world size, and the global batch.
#include "core/config_rules/rules.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "core/pipeline_layout.hpp"

namespace tandem::config_rules {

namespace {

// The options that describe the model's architecture.
constexpr std::array kArchitectureOptions{"--num-layers",        "--hidden-size",          "--ffn-hidden-size",
                                          "--num-attention-heads", "--num-query-groups", "--group-query-attention"};

// A command that does not read the architecture (tandem schedule) holds only the architecture
// the user gave to the layout's rules, not defaults the user never wrote.
bool holds_architecture(const RunArguments& args, const LaunchContext& launch) {
  const bool architecture_given = std::any_of(
      kArchitectureOptions.begin(), kArchitectureOptions.end(), [&args](const char* option) { return args.given(option); });
  return launch.needs_architecture || architecture_given;
}

// TP, PP, CP and the batch sizes, each with its option.
Checker::Counts layout_sizes(const RunConfig& config) {
  return {{config.parallel.tensor_parallel, "--tensor-model-parallel-size"},
          {config.parallel.pipeline_parallel, "--pipeline-model-parallel-size"},
          {config.parallel.context_parallel, "--context-parallel-size"},
          {config.batch.micro_batch_size, "--micro-batch-size"},
          {config.batch.global_batch_size, "--global-batch-size"}};
}

}  // namespace

// Every parallel size and batch size at least 1.
void check_layout_counts(const RunConfig& config, Checker& checker) {
  checker.check_at_least_one(layout_sizes(config));
}

// Every parallel size and batch size fits in 2^31 - 1.
void check_layout_dimensions(const RunConfig& config, Checker& checker) {
  checker.check_dimensions(layout_sizes(config));
}

// The architecture splits over the TP ranks as Megatron splits it.
void check_architecture_against_layout(const RunArguments& args, const LaunchContext& launch,
                                       const RunConfig& config, Checker& checker) {
  const std::int64_t tp = config.parallel.tensor_parallel;
  auto& model = config.model;
  if (holds_architecture(args, launch)) {
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
                  text(model.num_attention_heads) + default_note(args, "--num-attention-heads"),
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
                  text(model.ffn_hidden_size) + default_note(args, "--ffn-hidden-size"),
                  "must be divisible by --tensor-model-parallel-size (" + text(tp) + ")",
                  "choose F a multiple of TP");
    checker.check(model.head_dim() % 2 == 0 || model.hidden_size % model.num_attention_heads != 0,
                  "--hidden-size", text(model.hidden_size),
                  "head dim d/H must be even for rotary pairs (SPEC 4)",
                  "choose d and H with an even d/H");
  }
}

// Sequence and context parallelism, and the gradient and parameter overlap.
void resolve_parallel_options(const RunArguments& args, RunConfig& config, Checker& checker) {
  const std::int64_t tp = config.parallel.tensor_parallel;
  const std::int64_t cp = config.parallel.context_parallel;
  auto& model = config.model;
  auto& parallel = config.parallel;
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
}

// Interleaving and the layers of every pipeline stage and chunk.
void resolve_pipeline_split(const RunArguments& args, const LaunchContext& launch, RunConfig& config,
                            Checker& checker) {
  const std::int64_t pp = config.parallel.pipeline_parallel;
  auto& model = config.model;
  auto& parallel = config.parallel;
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
  if (holds_architecture(args, launch)) {
    try {
      (void)PipelineStages(pipeline_split(model, parallel));
    } catch (const ConfigError& error) {
      for (const ConfigIssue& issue : error.issues()) checker.fail(issue.field, issue.value, issue.rule, issue.fix);
    }
  }
}

// The world size and DP: the launcher when training; --world-size or --data-parallel-size when not.
void resolve_world_size(const RunArguments& args, const LaunchContext& launch, RunConfig& config,
                        Checker& checker) {
  const std::int64_t tp = config.parallel.tensor_parallel;
  const std::int64_t pp = config.parallel.pipeline_parallel;
  const std::int64_t cp = config.parallel.context_parallel;
  auto& parallel = config.parallel;
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
}

// GBS = micro-batch size x microbatches x DP, and the interleaved schedule's microbatches.
void check_global_batch(const RunConfig& config, Checker& checker) {
  auto& parallel = config.parallel;
  auto& batch = config.batch;
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
}

}  // namespace tandem::config_rules
