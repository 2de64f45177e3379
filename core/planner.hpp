// The planner behind `tandem plan`: from a validated RunConfig, every number a user checks before
// launching (SPEC 11): batch and token arithmetic, the pipeline bubble, the schedule's milestones,
// the parameter count by component, and memory per GPU. Formulas and their assumptions are in
// docs/PLANNER.md; this file computes, cli/plan_command.cpp prints.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/config.hpp"

namespace tandem {

struct RunLayout;  // core/run_layout.hpp

// Options that exist only for planning (bound by `tandem plan`, not by the run options).
struct PlanOptions {
  double gpu_memory_gib = 80.0;  // memory budget per GPU, GiB (2^30 bytes); 80 = an H100/A100 80GB
};

// Parameters by component, counted with the padded vocabulary (ModelConfig::padded_vocab_size),
// as the model allocates them. Biases are zero unless --add-bias-linear.
struct ParameterCount {
  std::int64_t embedding = 0;          // padded V x d
  // One decoder block:
  std::int64_t attention_q = 0;        // d x d (H heads of hd = d/H)
  std::int64_t attention_k = 0;        // d x kv, kv = G x hd
  std::int64_t attention_v = 0;        // d x kv
  std::int64_t attention_o = 0;        // d x d
  std::int64_t attention_biases = 0;   // d + kv + kv + d with --add-bias-linear
  std::int64_t mlp_gate = 0;           // d x F
  std::int64_t mlp_up = 0;             // d x F
  std::int64_t mlp_down = 0;           // F x d
  std::int64_t mlp_biases = 0;         // F + F + d with --add-bias-linear
  std::int64_t layer_norms = 0;        // two RMSNorm weights, 2 x d
  std::int64_t per_layer = 0;          // sum of the block's components
  std::int64_t all_layers = 0;         // L x per_layer
  std::int64_t final_norm = 0;         // d
  std::int64_t output_layer = 0;       // padded V x d; 0 when tied to the embedding (SPEC 4)
  std::int64_t total = 0;              // embedding + all_layers + final_norm + output_layer
};

// The data-parallel exchange of one GPU of one stage per update, by the production trainer's rule
// (production/sharding.hpp): buckets of gradient_bucket_parameters rounded up to a multiple of
// DP x 1,024 (one bucket without --overlap-grad-reduce), rank r owning slice r of each; the fp32
// main gradients reduce-scattered (as Megatron's --bf16 does unless --grad-reduce-in-bf16), then
// the compute weights (distributed optimizer) or the reduced fp32 gradients (replicated)
// all-gathered. Bytes each rank sends; it receives as many.
struct GradientExchange {
  std::int64_t buckets = 0;
  std::int64_t bucket_parameters = 0;   // the first bucket's, padding included
  std::int64_t slice_parameters = 0;    // one rank's part of the first bucket
  double reduce_scatter_gib = 0.0;      // (DP - 1) / DP x padded x 4 B
  double all_gather_gib = 0.0;          // (DP - 1) / DP x padded x (compute or 4) B
};

// Memory of one GPU of one pipeline stage, GiB (2^30 bytes).
struct StageMemory {
  std::string stage;                    // "first", "last", or "only" when PP = 1
  std::int64_t parameters_per_gpu = 0;  // this stage's parameters held by one TP rank
  double weights_gib = 0.0;             // compute weights: bf16 (2 B) or fp32 (4 B) per parameter
  double main_grads_gib = 0.0;          // fp32 main gradients, 4 B per parameter (never sharded)
  double optimizer_state_gib = 0.0;     // fp32 main params (bf16 only) + Adam m and v; / DP when
                                        // --use-distributed-optimizer
  double activations_in_flight = 0.0;   // microbatches' activations held at once (1F1B; may carry
                                        // the interleaving factor, so not always whole)
  double activations_gib = 0.0;         // stored activations for backward, incl. recompute work
  double working_gib = 0.0;             // the trainer's working buffers (slot inputs, one chunk of
                                        // logits, one layer's backward scratch, ...: docs/PLANNER.md)
  double total_gib = 0.0;               // sum of the five above
  GradientExchange exchange;            // not memory: the stage's DP traffic per update
};

struct MemoryPlan {
  RecomputeGranularity recompute = RecomputeGranularity::none;
  double activation_bytes_per_layer = 0.0;  // one layer, one microbatch, one GPU, stored for bwd
                                            // by tandem's trainer (production/model.hpp)
  // The same by Megatron's count without flash attention (the s x s softmax output kept under
  // recompute none): a labelled comparison, not used in the totals.
  double megatron_activation_bytes_per_layer = 0.0;
  std::vector<StageMemory> stages;          // first and last stage (one entry when PP = 1)
  double peak_gib = 0.0;                    // max over stages
  double budget_gib = 0.0;                  // PlanOptions::gpu_memory_gib
};

// A point of the learning-rate schedule an update uses (SPEC 8: update k uses lr((k-1) x GBS)).
struct LrMilestone {
  std::string name;                      // "first_update", "end_of_warmup", ...
  std::int64_t update = 0;               // 1-based update number
  std::int64_t scheduler_samples = 0;    // n the update's lr is taken at, samples
  double lr = 0.0;
  double wd = 0.0;
};

// Pipeline bubble for a hypothetical microbatch count (SPEC 11's 12 / 24 / 48 table).
struct BubbleAlternative {
  std::int64_t microbatches_per_replica = 0;
  std::int64_t global_batch_size = 0;   // samples = mbs x microbatches x DP
  std::int64_t tokens_per_update = 0;   // global_batch_size x seq_length
  double bubble_fraction = 0.0;
};

struct AttentionPairs {
  std::int64_t seq_length = 0;          // tokens
  std::int64_t causal_pairs = 0;        // L(L+1)/2 (SPEC 11)
};

struct Plan {
  RunConfig config;
  PlanOptions options;

  // Layout (SPEC 11: TP8 x PP8 x DP80 = 5,120 GPUs).
  std::int64_t world_size = 0;
  std::int64_t data_parallel_size = 0;
  std::string layout;  // "TP8 x PP8 x CP1 x DP80 = 5120 GPUs"

  // Batch arithmetic (SPEC 1).
  std::int64_t sequences_per_update = 0;       // GBS, samples
  std::int64_t tokens_per_update = 0;          // GBS x seq_length, input tokens
  std::int64_t microbatches_per_replica = 0;   // GBS / (mbs x DP)
  std::int64_t virtual_pipeline_stages = 1;    // v; 1 = plain 1F1B
  double pipeline_bubble_fraction = 0.0;       // idle share of the step: (p-1) / (v m + p - 1)
  std::vector<BubbleAlternative> bubble_alternatives;  // m/2, m, 2m

  // Attention work (SPEC 11).
  std::int64_t attention_pairs_per_sequence = 0;
  std::vector<AttentionPairs> attention_pairs_by_length;  // L/2 and L

  // Training length (SPEC 2, 11).
  std::int64_t total_updates = 0;
  std::int64_t total_samples = 0;              // total_updates x GBS
  std::int64_t total_tokens = 0;               // total_samples x seq_length
  std::int64_t train_samples_remainder = 0;    // --train-samples mod GBS, never trained
  std::int64_t warmup_samples = 0;             // W
  std::int64_t warmup_updates = 0;             // updates that use a warmup lr below the peak
  std::int64_t warmup_tokens = 0;              // W x seq_length
  std::int64_t decay_samples = 0;              // D

  // Token conveniences (RunConfig::token_rounding): absent when the run was given in samples.
  std::optional<double> requested_train_tokens;
  std::optional<std::int64_t> budget_shortfall_tokens;   // requested - total_tokens, >= 0
  std::optional<double> requested_warmup_tokens;
  std::optional<std::int64_t> warmup_excess_tokens;      // warmup_tokens - requested, >= 0

  // Schedule (SPEC 8), from core/schedule.hpp.
  std::vector<LrMilestone> lr_milestones;
  std::int64_t decay_midpoint_samples = 0;     // W + (D - W) / 2
  double lr_at_decay_midpoint = 0.0;           // lr(W + (D - W) / 2)
  double decay_multiplier_at_peak = 0.0;       // 1 - lr_max x wd at the peak (SPEC 7, 11)

  ParameterCount parameters;
  MemoryPlan memory;
  std::vector<std::string> warnings;
};

// Builds the plan of a RunConfig that build_run_config already validated, on its layout
// (core/run_layout.hpp); the first form derives the layout itself.
Plan make_plan(const RunConfig& config, const PlanOptions& options);
Plan make_plan(const RunConfig& config, const RunLayout& layout, const PlanOptions& options);

// The causal position pairs of one window of `seq_length` tokens: L(L+1)/2.
std::int64_t causal_attention_pairs(std::int64_t seq_length);

// Idle share of a pipelined step (Narayanan et al. 2021): (p - 1) / (v m + p - 1).
double pipeline_bubble_fraction(std::int64_t pipeline_stages, std::int64_t microbatches,
                                std::int64_t virtual_stages);

ParameterCount count_parameters(const ModelConfig& model);

void to_json(nlohmann::json& out, const Plan& plan);

// The readable table of `tandem plan`.
void print_plan(std::ostream& out, const Plan& plan);

}  // namespace tandem
