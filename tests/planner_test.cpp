// The planner (core/planner.hpp) as properties over generated layouts and budgets: batch and token
// arithmetic, the bubble, token rounding (SPEC 11), parameter counts by hand, the memory model's
// orderings, and the warnings. Configurations go through build_run_config, as `tandem plan`'s do.
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <rapidcheck/gtest.h>

#include "core/args.hpp"
#include "tests/support/parse_run.hpp"
#include "core/planner.hpp"

namespace tandem {
namespace {

using testing::parse_run;
using testing::with;

// A layout drawn from the domain: every count positive and the divisibility rules met by
// construction (GBS = mbs x m x DP, L = PP x layers per stage).
struct Layout {
  std::int64_t micro_batch_size;
  std::int64_t microbatches;
  std::int64_t data_parallel;
  std::int64_t pipeline_parallel;
  std::int64_t seq_length;
  std::int64_t global_batch_size() const { return micro_batch_size * microbatches * data_parallel; }
};

Layout draw_layout() {
  Layout layout{};
  layout.micro_batch_size = *rc::gen::inRange<std::int64_t>(1, 9);
  layout.microbatches = *rc::gen::inRange<std::int64_t>(1, 65);
  layout.data_parallel = *rc::gen::inRange<std::int64_t>(1, 129);
  layout.pipeline_parallel = *rc::gen::inRange<std::int64_t>(1, 9);
  layout.seq_length = *rc::gen::inRange<std::int64_t>(1, 1 << 16);
  return layout;
}

std::vector<std::string> arguments_for(const Layout& layout) {
  const std::int64_t layers = 2 * layout.pipeline_parallel;
  return {"--num-layers", std::to_string(layers), "--hidden-size", "32",
          "--num-attention-heads", "4", "--seq-length", std::to_string(layout.seq_length),
          "--micro-batch-size", std::to_string(layout.micro_batch_size),
          "--global-batch-size", std::to_string(layout.global_batch_size()),
          "--data-parallel-size", std::to_string(layout.data_parallel),
          "--pipeline-model-parallel-size", std::to_string(layout.pipeline_parallel)};
}

// ---- Batch and token arithmetic (SPEC 1, 2, 11) ----

RC_GTEST_PROP(Planner, TokensPerUpdateAreSequencesTimesLength, ()) {
  const Layout layout = draw_layout();
  const auto updates = *rc::gen::inRange<std::int64_t>(1, 1000);
  const auto remainder = *rc::gen::inRange<std::int64_t>(0, layout.global_batch_size());
  const std::int64_t train_samples = updates * layout.global_batch_size() + remainder;
  const Plan plan = make_plan(
      parse_run(with(arguments_for(layout), {"--train-samples", std::to_string(train_samples)})),
      PlanOptions{});
  RC_ASSERT(plan.sequences_per_update == layout.global_batch_size());
  RC_ASSERT(plan.tokens_per_update == layout.global_batch_size() * layout.seq_length);
  RC_ASSERT(plan.microbatches_per_replica == layout.microbatches);
  RC_ASSERT(plan.data_parallel_size == layout.data_parallel);
  // SPEC 2: floor(train_samples / GBS) updates, the remainder reported and never trained.
  RC_ASSERT(plan.total_updates == updates);
  RC_ASSERT(plan.total_samples == updates * layout.global_batch_size());
  RC_ASSERT(plan.total_tokens == plan.total_samples * layout.seq_length);
  RC_ASSERT(plan.train_samples_remainder == remainder);
  RC_ASSERT(plan.attention_pairs_per_sequence ==
            layout.seq_length * (layout.seq_length + 1) / 2);
}

RC_GTEST_PROP(Planner, TokenBudgetRoundsDownAndWarmupRoundsUpByLessThanOneUpdate, ()) {
  const Layout layout = draw_layout();
  const std::int64_t tokens_per_update = layout.global_batch_size() * layout.seq_length;
  // Integers below 2^50, exact in the double parse_token_count returns.
  const auto warmup_tokens = *rc::gen::inRange<std::int64_t>(1, std::int64_t{1} << 40);
  const auto extra = *rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 40);
  // At least two updates past the rounded-up warmup, so W <= D holds by construction.
  const std::int64_t train_tokens = warmup_tokens + 2 * tokens_per_update + extra;
  const Plan plan = make_plan(
      parse_run(with(arguments_for(layout), {"--train-tokens", std::to_string(train_tokens),
                                             "--lr-warmup-tokens", std::to_string(warmup_tokens)})),
      PlanOptions{});
  RC_ASSERT(plan.warmup_tokens >= warmup_tokens);
  RC_ASSERT(plan.warmup_tokens < warmup_tokens + tokens_per_update);
  RC_ASSERT(plan.warmup_tokens % tokens_per_update == 0);
  RC_ASSERT(plan.warmup_excess_tokens.has_value());
  RC_ASSERT(*plan.warmup_excess_tokens == plan.warmup_tokens - warmup_tokens);
  RC_ASSERT(plan.total_tokens <= train_tokens);
  RC_ASSERT(plan.total_tokens > train_tokens - tokens_per_update);
  RC_ASSERT(plan.budget_shortfall_tokens.has_value());
  RC_ASSERT(*plan.budget_shortfall_tokens == train_tokens - plan.total_tokens);
  RC_ASSERT(plan.train_samples_remainder == 0);  // whole updates by construction
}

TEST(Planner, SampleSpansReportNoTokenRounding) {
  const Plan plan = make_plan(parse_run(with(arguments_for({1, 4, 2, 1, 16}),
                                             {"--train-samples", "80"})),
                              PlanOptions{});
  EXPECT_FALSE(plan.budget_shortfall_tokens.has_value());
  EXPECT_FALSE(plan.warmup_excess_tokens.has_value());
  nlohmann::json json;
  to_json(json, plan);
  EXPECT_TRUE(json.at("budget_shortfall_tokens").is_null());
}

// ---- Pipeline bubble ----

RC_GTEST_PROP(Planner, BubbleFallsAsMicrobatchesGrow, ()) {
  const auto stages = *rc::gen::inRange<std::int64_t>(2, 65);
  const auto virtual_stages = *rc::gen::inRange<std::int64_t>(1, 9);
  const auto fewer = *rc::gen::inRange<std::int64_t>(1, 10000);
  const auto more = fewer + *rc::gen::inRange<std::int64_t>(1, 10000);
  const double bubble_fewer = pipeline_bubble_fraction(stages, fewer, virtual_stages);
  const double bubble_more = pipeline_bubble_fraction(stages, more, virtual_stages);
  RC_ASSERT(bubble_more < bubble_fewer);
  RC_ASSERT(bubble_more > 0.0);
  // Interleaving (v > 1) never raises it: (p-1)/(v m + p-1) <= (p-1)/(m + p-1).
  RC_ASSERT(bubble_fewer <= pipeline_bubble_fraction(stages, fewer, 1));
}

RC_GTEST_PROP(Planner, OneStageHasNoBubble, ()) {
  const auto microbatches = *rc::gen::inRange<std::int64_t>(1, 10000);
  RC_ASSERT(pipeline_bubble_fraction(1, microbatches, 1) == 0.0);  // exact: 0 / (m + 0)
}

TEST(Planner, BubbleIsTheIdealOneFOneBFraction) {
  // Exact: the same IEEE division as (p-1)/(m+p-1) with p = 8 (SPEC 11).
  EXPECT_EQ(pipeline_bubble_fraction(8, 24, 1), 7.0 / 31.0);
  // Interleaved with v = 2: Narayanan et al.'s bubble/compute (1/v)(p-1)/m = 7/48 as a share of
  // the whole step: 7 / (2 x 24 + 7) = 7/55.
  EXPECT_EQ(pipeline_bubble_fraction(8, 24, 2), 7.0 / 55.0);
}

// ---- Parameters (SPEC 4) ----

TEST(Planner, ParametersByComponentForASmallModel) {
  // d = 32, H = 4 (hd 8), G = 2 (kv = 16), F = 64, L = 2, V = 258 -> padded to 384 (TP 1).
  const RunConfig config = parse_run({"--num-layers", "2", "--hidden-size", "32",
                                      "--num-attention-heads", "4", "--group-query-attention",
                                      "--num-query-groups", "2", "--ffn-hidden-size", "64",
                                      "--seq-length", "16", "--global-batch-size", "4",
                                      "--train-samples", "8"});
  const ParameterCount count = count_parameters(config.model);
  EXPECT_EQ(count.embedding, 384 * 32);
  EXPECT_EQ(count.attention_q, 32 * 32);
  EXPECT_EQ(count.attention_k, 32 * 16);
  EXPECT_EQ(count.attention_v, 32 * 16);
  EXPECT_EQ(count.attention_o, 32 * 32);
  EXPECT_EQ(count.attention_biases, 0);  // SPEC 4: biases off by default
  EXPECT_EQ(count.mlp_gate, 32 * 64);
  EXPECT_EQ(count.mlp_up, 32 * 64);
  EXPECT_EQ(count.mlp_down, 64 * 32);
  EXPECT_EQ(count.layer_norms, 2 * 32);
  const std::int64_t per_layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32;
  EXPECT_EQ(count.per_layer, per_layer);
  EXPECT_EQ(count.all_layers, 2 * per_layer);
  EXPECT_EQ(count.final_norm, 32);
  EXPECT_EQ(count.output_layer, 384 * 32);  // SPEC 4: untied by default
  EXPECT_EQ(count.total, 384 * 32 + 2 * per_layer + 32 + 384 * 32);
}

TEST(Planner, TiedEmbeddingsCountOnceAndBiasesWhenOn) {
  const RunConfig config = parse_run({"--num-layers", "1", "--hidden-size", "32",
                                      "--num-attention-heads", "4", "--ffn-hidden-size", "64",
                                      "--seq-length", "16", "--global-batch-size", "4",
                                      "--train-samples", "8", "--tie-embeddings-and-output-weights",
                                      "--add-bias-linear"});
  const ParameterCount count = count_parameters(config.model);
  EXPECT_EQ(count.output_layer, 0);                      // counted once, in the embedding
  EXPECT_EQ(count.attention_biases, 32 + 32 + 32 + 32);  // q, k, v (kv = d when G = H), o
  EXPECT_EQ(count.mlp_biases, 64 + 64 + 32);             // gate, up, down
  EXPECT_EQ(count.total, 384 * 32 + count.per_layer + 32);
}

// ---- Memory ----

RC_GTEST_PROP(Planner, DistributedOptimizerShardsOptimizerStateOverDataParallel, ()) {
  Layout layout = draw_layout();
  const auto arguments = with(arguments_for(layout), {"--train-samples",
                                                      std::to_string(layout.global_batch_size()),
                                                      "--bf16"});
  const Plan plain = make_plan(parse_run(arguments), PlanOptions{});
  const Plan sharded =
      make_plan(parse_run(with(arguments, {"--use-distributed-optimizer"})), PlanOptions{});
  for (std::size_t i = 0; i < plain.memory.stages.size(); ++i) {
    const double expected =
        plain.memory.stages[i].optimizer_state_gib / static_cast<double>(layout.data_parallel);
    // Approximate: the two sides divide the same product in a different order (2 roundings).
    RC_ASSERT(std::abs(sharded.memory.stages[i].optimizer_state_gib - expected) <=
              4.0 * std::numeric_limits<double>::epsilon() * expected);
    RC_ASSERT(sharded.memory.stages[i].weights_gib == plain.memory.stages[i].weights_gib);
    RC_ASSERT(sharded.memory.stages[i].main_grads_gib == plain.memory.stages[i].main_grads_gib);
  }
}

RunConfig recomputing(RunConfig config, RecomputeGranularity granularity,
                      RecomputeMethod method = RecomputeMethod::uniform, std::int64_t layers = 0) {
  config.recompute.granularity = granularity;
  config.recompute.method = method;
  config.recompute.num_layers = layers;
  return config;
}

RC_GTEST_PROP(Planner, RecomputeStoresLessActivations, ()) {
  const Layout layout = draw_layout();
  const RunConfig config = parse_run(with(
      arguments_for(layout), {"--train-samples", std::to_string(layout.global_batch_size())}));
  auto memory = [&](RecomputeGranularity granularity) {
    return make_plan(recomputing(config, granularity, RecomputeMethod::uniform, 1), PlanOptions{}).memory;
  };
  const double none = memory(RecomputeGranularity::none).activation_bytes_per_layer;
  const double selective = memory(RecomputeGranularity::selective).activation_bytes_per_layer;
  const double full = memory(RecomputeGranularity::full).activation_bytes_per_layer;
  RC_ASSERT(full < selective);
  // tandem's attention is flash-style: selective recomputation has nothing left to save.
  RC_ASSERT(selective == none);
  // Megatron's count without flash attention: none adds the H x s^2 attention scores.
  RC_ASSERT(memory(RecomputeGranularity::selective).megatron_activation_bytes_per_layer <
            memory(RecomputeGranularity::none).megatron_activation_bytes_per_layer);
}

// Megatron's methods per model chunk: uniform groups of n keep one input per group and rebuild n
// layers at once; block keeps the first n layers' inputs and everything of the others.
TEST(Planner, RecomputeMethodsCountTheirGroupsPerModelChunk) {
  const RunConfig config = parse_run({"--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4",
                                      "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
                                      "--train-samples", "4", "--pipeline-model-parallel-size", "2",
                                      "--world-size", "2"});
  const double whole = make_plan(config, PlanOptions{}).memory.activation_bytes_per_layer;
  const double input =
      make_plan(recomputing(config, RecomputeGranularity::full, RecomputeMethod::uniform, 1), PlanOptions{})
          .memory.activation_bytes_per_layer;
  auto first_stage_bytes = [&](const RunConfig& run) {
    const StageMemory first = make_plan(run, PlanOptions{}).memory.stages.front();  // a copy: the plan is a temporary
    return first.activations_gib * 1024.0 * 1024.0 * 1024.0;  // GiB = 2^30 bytes
  };
  // The first of two stages: 4 layers, min(PP, M) = 2 microbatches in flight.
  EXPECT_DOUBLE_EQ(first_stage_bytes(config), 2 * 4 * whole);
  EXPECT_DOUBLE_EQ(first_stage_bytes(recomputing(config, RecomputeGranularity::full, RecomputeMethod::uniform, 1)),
                   2 * 4 * input + 1 * whole);
  // Groups of 3 over 4 layers: [0, 3) and [3, 4); three layers rebuilt at once.
  EXPECT_DOUBLE_EQ(first_stage_bytes(recomputing(config, RecomputeGranularity::full, RecomputeMethod::uniform, 3)),
                   2 * 2 * input + 3 * whole);
  // More than the chunk holds: one group of all four.
  EXPECT_DOUBLE_EQ(first_stage_bytes(recomputing(config, RecomputeGranularity::full, RecomputeMethod::uniform, 9)),
                   2 * 1 * input + 4 * whole);
  EXPECT_DOUBLE_EQ(first_stage_bytes(recomputing(config, RecomputeGranularity::full, RecomputeMethod::block, 1)),
                   2 * (1 * input + 3 * whole) + 1 * whole);
  EXPECT_DOUBLE_EQ(first_stage_bytes(recomputing(config, RecomputeGranularity::full, RecomputeMethod::block, 4)),
                   2 * 4 * input + 1 * whole);
}

TEST(Planner, FirstStageHoldsMinOfStagesAndMicrobatchesInFlight) {
  // p = 4: with m = 2 microbatches the first stage holds 2; with m = 8 it holds 4 (1F1B).
  const Plan few = make_plan(parse_run(with(arguments_for({1, 2, 1, 4, 16}),
                                            {"--train-samples", "2"})),
                             PlanOptions{});
  const Plan many = make_plan(parse_run(with(arguments_for({1, 8, 1, 4, 16}),
                                             {"--train-samples", "8"})),
                              PlanOptions{});
  ASSERT_EQ(few.memory.stages.size(), 2u);
  EXPECT_EQ(few.memory.stages[0].activations_in_flight, 2.0);
  EXPECT_EQ(many.memory.stages[0].activations_in_flight, 4.0);
  EXPECT_EQ(many.memory.stages[1].activations_in_flight, 1.0);  // the last stage: one at a time
}

TEST(Planner, ActivationsFollowTheDocumentedFormula) {
  // docs/PLANNER.md, no recompute, bf16 (2 bytes), TP 1, CP 1, s = 16, b = 1, d = 32, kv = 32,
  // F = 64, H = 4. tandem's trainer: 2 x (4 s d + 2 s d + 2 s kv + 3 s F) + 4 x (2 s + H s);
  // Megatron's count without flash attention: 2 x (4 s d + 2 s d + 2 s kv + 3 s F + H s^2).
  const Plan plan = make_plan(parse_run({"--num-layers", "2", "--hidden-size", "32",
                                         "--num-attention-heads", "4", "--ffn-hidden-size", "64",
                                         "--seq-length", "16", "--global-batch-size", "4",
                                         "--train-samples", "8", "--bf16"}),
                              PlanOptions{});
  const double compute = 4 * 16 * 32 + 2 * 16 * 32 + 2 * 16 * 32 + 3 * 16 * 64;
  EXPECT_EQ(plan.memory.activation_bytes_per_layer, 2.0 * compute + 4.0 * (2 * 16 + 4 * 16));  // exact
  EXPECT_EQ(plan.memory.megatron_activation_bytes_per_layer, 2.0 * (compute + 4 * 16 * 16));
}

// ---- Warnings ----

bool has_warning(const Plan& plan, const std::string& fragment) {
  for (const auto& warning : plan.warnings) {
    if (warning.find(fragment) != std::string::npos) return true;
  }
  return false;
}

TEST(Planner, WarnsAboutMicrobatchMeanWithMasking) {
  const auto base = with(arguments_for({1, 4, 1, 1, 16}), {"--train-samples", "8"});
  EXPECT_TRUE(has_warning(
      make_plan(parse_run(with(base, {"--loss-normalization", "microbatch-mean"})), {}),
      "SPEC 5"));
  EXPECT_FALSE(has_warning(make_plan(parse_run(base), {}), "SPEC 5"));  // per-token: invariant
  // Negative control: masking off and concat packing (no padding) is split-invariant.
  EXPECT_FALSE(has_warning(
      make_plan(parse_run(with(base, {"--loss-normalization", "microbatch-mean",
                                      "--no-eod-mask-loss"})),
                {}),
      "SPEC 5"));
}

TEST(Planner, WarnsAboutRemainderBubbleAndMemory) {
  // p = 4, m = 4: bubble 3/7 = 43 % > 25 %; 10 samples at GBS 4 leave 2.
  const Plan plan = make_plan(parse_run(with(arguments_for({1, 4, 1, 4, 16}),
                                             {"--train-samples", "10"})),
                              PlanOptions{});
  EXPECT_TRUE(has_warning(plan, "bubble"));
  EXPECT_TRUE(has_warning(plan, "SPEC 2"));
  EXPECT_EQ(plan.train_samples_remainder, 10 - 2 * 4);
  EXPECT_FALSE(has_warning(plan, "memory"));
  PlanOptions tiny;
  tiny.gpu_memory_gib = 1e-9;  // about one byte
  EXPECT_TRUE(has_warning(make_plan(plan.config, tiny), "memory"));
}

TEST(Planner, JsonHasTheContractKeys) {
  const Plan plan = make_plan(parse_run(with(arguments_for({1, 4, 2, 2, 16}),
                                             {"--train-samples", "80"})),
                              PlanOptions{});
  nlohmann::json json;
  to_json(json, plan);
  for (const char* key :
       {"world_size", "data_parallel_size", "sequences_per_update", "tokens_per_update",
        "microbatches_per_replica", "pipeline_bubble_fraction", "warmup_updates",
        "warmup_tokens", "total_updates", "total_samples", "total_tokens",
        "train_samples_remainder", "budget_shortfall_tokens", "attention_pairs_per_sequence",
        "lr_milestones", "decay_multiplier_at_peak", "parameters", "memory_per_gpu",
        "warnings"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  std::set<std::string> names;
  for (const auto& point : json.at("lr_milestones")) names.insert(point.at("name").get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"first_update", "end_of_warmup", "decay_midpoint",
                                          "last_update"}));
}

}  // namespace
}  // namespace tandem
