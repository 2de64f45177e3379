// Pipeline parallelism in the production trainer (cpu backend, TP x PP x DP ranks on threads;
// core/pipeline_layout.hpp, production/model.hpp, trainer.cpp): each stage holds its layers, the
// stream and its gradient pass between stages, the tied embedding's two copies are summed and
// counted once; held to the double reference (SPEC 13), bitwise equal to one stage where the
// arithmetic is the same, checkpoints resumed bit-exactly and read at other layouts.
//
// Kinds of comparison:
//   - exact: iteration 0's weights for every PP; an untied model without clipping, PP 2 and 4
//     against PP 1 (every element's gradient is the same operations on the same inputs, the
//     stream crosses stages as bytes, the loss is the last stage's, as PP 1 computes it);
//   - deterministic (bitwise): save + resume vs straight; a checkpoint of one layout read at another;
//   - approximate: every update against the reference through the harness's comparison
//     (equivalence/comparison.hpp), with PP's regrouped sums (the norm per stage, a tied
//     embedding's two copies summed after their reductions) inside the same derived bounds.
#include <filesystem>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/main_state.hpp"
#include "core/init.hpp"
#include "core/planner.hpp"
#include "core/run_layout.hpp"
#include "equivalence/comparison.hpp"
#include "equivalence/twin.hpp"
#include "production/checkpointing.hpp"
#include "production/local_ranks.hpp"
#include "tests/support/model_parallel_ranks.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace tandem {
namespace {

using production::HostState;
using production::LocalRanks;
using production::Trainer;

// The tiny model with 4 layers (d 32, 4 heads in 2 groups, F 64, padded vocabulary 384, seq 32) on
// TP x PP x DP ranks, mbs 1, 4 samples per update (2 microbatches a replica at DP 2).
RunConfig pp_run(std::int64_t pp, std::int64_t tp = 1, std::int64_t dp = 1) {
  RunConfig config = testing::tiny_data_parallel_run(dp, 4);
  config.model.num_layers = 4;
  config.parallel.pipeline_parallel = pp;
  config.parallel.tensor_parallel = tp;
  config.parallel.sequence_parallel = tp > 1;
  config.parallel.world_size = tp * pp * dp;
  testing::set_clipped_cosine_schedule(config);
  return config;
}

using testing::compare_with_the_reference;
using testing::expect_same_state;
using testing::Ranks;

TEST(PipelineParallel, TheRanksOfAProcessShareOneLayoutAndALayoutOfAnotherRunIsRefused) {
  // Derived once (core/run_layout.hpp): every rank on a thread reads the same stages.
  Ranks ranks(pp_run(2, 2, 1));
  std::vector<const PipelineStages*> stages(ranks.ranks.size());
  ranks.ranks.each([&](const Trainer& trainer, int rank) { stages[static_cast<std::size_t>(rank)] = &trainer.pipeline_stages(); });
  for (const PipelineStages* each : stages) EXPECT_EQ(each, stages.front());
  EXPECT_EQ(stages.front()->layers(1, 0), (LayerRange{2, 4}));
  // One rank's configuration with the layout of a PP 2 run: it would build the wrong layers.
  production::ProductionOptions options = testing::cpu_options();
  options.layout = std::make_shared<const RunLayout>(pp_run(2));
  const auto samples = testing::tiny_production_samples();
  EXPECT_THROW(Trainer(pp_run(1), samples, options), std::invalid_argument);
  RunConfig uneven = pp_run(2);
  uneven.parallel.first_pipeline_stage_layers = 1;
  options.layout = std::make_shared<const RunLayout>(uneven);
  // The same grid, another split of the layers: refused on every rank.
  EXPECT_THROW(Ranks(pp_run(2), options), std::invalid_argument);
  options.layout = std::make_shared<const RunLayout>(pp_run(2));
  EXPECT_NO_THROW(Ranks(pp_run(2), options));
}

TEST(PipelineParallel, IterationZeroIsTheSameWeightsForEveryLayout) {
  // SPEC 4 / 13: each element drawn by its index in the full tensor, whichever stage holds it.
  for (const auto& [pp, tp, tied] : {std::tuple{2, 1, false}, std::tuple{4, 1, true}, std::tuple{2, 2, true}}) {
    RunConfig config = pp_run(pp, tp);
    config.model.tie_embeddings = tied;
    Ranks ranks(config);
    EXPECT_EQ(ranks.state().params, initial_parameters(config.model, config.data.seed))
        << "PP " << pp << " TP " << tp << (tied ? " tied" : "");
  }
}

TEST(PipelineParallel, AnUntiedModelWithoutClippingIsBitwiseOneStage) {
  // Exact: each stage runs its layers' operations on the bytes the previous stage sent; the loss
  // is the last stage's sum in PP 1's order. Only the norm is summed per stage (not compared).
  const auto run = [](std::int64_t pp, std::int64_t dp, std::int64_t chunks, std::int64_t layers) {
    RunConfig config = pp_run(pp, 1, dp);
    config.model.num_layers = layers;
    config.optimizer.clip_grad = 0.0;
    config.parallel.virtual_pipeline_stages = chunks;
    Ranks ranks(config);
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(ranks.run().front().loss);
    return std::make_pair(losses, ranks.state());
  };
  // The interleaved 1F1B too: each chunk's backwards in microbatch order (PP 2 x 2 chunks with
  // 4 microbatches a replica, and with 2, all in warmup; PP 4 x 2 chunks).
  for (const auto& [pp, dp, chunks] : {std::tuple{2, 1, 1}, std::tuple{4, 1, 1}, std::tuple{2, 2, 1},
                                       std::tuple{2, 1, 2}, std::tuple{2, 2, 2}, std::tuple{4, 1, 2}}) {
    const auto [losses, state] = run(1, dp, 1, 4 * chunks);  // one stage, the same replicas and layers
    const auto [pp_losses, pp_state] = run(pp, dp, chunks, 4 * chunks);
    const std::string what = "PP " + std::to_string(pp) + " DP " + std::to_string(dp) + " chunks " +
                             std::to_string(chunks);
    EXPECT_EQ(pp_losses, losses) << what;
    expect_same_state(pp_state, state, what);
  }
}

TEST(PipelineParallel, TheTimelineHoldsEveryStagesPassesInScheduleOrderOnOneClock) {
  for (const auto& [pp, chunks] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
    RunConfig config = pp_run(pp);
    config.model.num_layers = 4 * chunks;
    config.parallel.virtual_pipeline_stages = chunks;
    const std::string what = "PP " + std::to_string(pp) + " x " + std::to_string(chunks) + " chunks";
    production::ProductionOptions options = testing::cpu_options();
    options.pipeline_timeline = true;
    Ranks ranks(config, options);
    ranks.run();
    std::vector<production::PipelineTimeline> timelines(static_cast<std::size_t>(pp));
    ranks.ranks.each([&](const Trainer& trainer, int rank) {
      ASSERT_TRUE(trainer.last_timeline().has_value()) << what;
      timelines[static_cast<std::size_t>(rank)] = *trainer.last_timeline();
    });
    const production::PipelineTimeline& timeline = timelines.front();
    EXPECT_EQ(timeline.iteration, 1) << what;
    ASSERT_EQ(timeline.stages.size(), static_cast<std::size_t>(pp)) << what;
    const std::int64_t microbatches = config.microbatches_per_replica();
    for (std::int64_t stage = 0; stage < pp; ++stage) {
      const auto schedule = chunks == 1
                                ? one_forward_one_backward(pp, stage, microbatches)
                                : interleaved_one_forward_one_backward(pp, stage, chunks, microbatches);
      const auto& passes = timeline.stages[static_cast<std::size_t>(stage)];
      ASSERT_EQ(passes.size(), schedule.size()) << what;
      double previous_end = 0.0;
      for (std::size_t i = 0; i < passes.size(); ++i) {
        EXPECT_EQ(passes[i].pass.forward, schedule[i].forward) << what << " stage " << stage << " pass " << i;
        EXPECT_EQ(passes[i].pass.microbatch, schedule[i].microbatch) << what << " stage " << stage << " pass " << i;
        EXPECT_EQ(passes[i].pass.chunk, schedule[i].chunk) << what << " stage " << stage << " pass " << i;
        // One pass at a time on a stage, on the iteration's clock.
        EXPECT_LE(previous_end, passes[i].start) << what << " stage " << stage << " pass " << i;
        EXPECT_LT(passes[i].start, passes[i].end) << what << " stage " << stage << " pass " << i;
        previous_end = passes[i].end;
      }
      EXPECT_LE(timeline.busy(static_cast<std::size_t>(stage)), timeline.span()) << what;
    }
    EXPECT_GE(timeline.idle_fraction(), 0.0) << what;
    EXPECT_LT(timeline.idle_fraction(), 1.0) << what;
    // Every rank holds the same gathered timeline.
    for (const auto& other : timelines) {
      for (std::size_t stage = 0; stage < other.stages.size(); ++stage) {
        for (std::size_t i = 0; i < other.stages[stage].size(); ++i) {
          EXPECT_EQ(other.stages[stage][i].start, timeline.stages[stage][i].start) << what;
          EXPECT_EQ(other.stages[stage][i].end, timeline.stages[stage][i].end) << what;
        }
      }
    }
  }
  // Not asked for: none.
  Ranks untimed(pp_run(2));
  untimed.run();
  untimed.ranks.each([](const Trainer& trainer, int) { EXPECT_FALSE(trainer.last_timeline().has_value()); });
}

TEST(PipelineParallel, EvaluationOnEveryStageLayoutIsBitwiseOneStage) {
  // Forward only, one microbatch at a time through the stages and chunks; the loss is the last
  // stage's sum in one stage's order: bit for bit the one-stage evaluation, at iteration 0 (the
  // same weights for every layout, tied or not) and after two updates of an untied model without
  // clipping (whose training is bitwise one stage).
  const testing::StreamSamples validation = testing::tiny_production_samples();
  const auto evaluate = [&](std::int64_t pp, std::int64_t chunks, bool tied, int updates) {
    RunConfig config = pp_run(pp);
    config.model.num_layers = 4 * chunks;
    config.model.tie_embeddings = tied;
    config.optimizer.clip_grad = 0.0;
    config.parallel.virtual_pipeline_stages = pp > 1 ? chunks : 1;  // one stage: the same layers, no chunks
    Ranks ranks(config);
    for (int i = 0; i < updates; ++i) ranks.run();
    std::vector<EvaluationRecord> records(static_cast<std::size_t>(pp));
    ranks.ranks.each([&](Trainer& trainer, int rank) {
      records[static_cast<std::size_t>(rank)] = trainer.evaluate(validation, 2);
    });
    for (const EvaluationRecord& record : records) EXPECT_EQ(record.loss, records.front().loss);
    return records.front();
  };
  for (const auto& [pp, chunks, tied, updates] :
       {std::tuple{2, 1, true, 0}, std::tuple{4, 1, false, 0}, std::tuple{2, 2, true, 0}, std::tuple{2, 1, false, 2},
        std::tuple{2, 2, false, 2}}) {
    const std::string what = "PP " + std::to_string(pp) + " x " + std::to_string(chunks) + " chunks" +
                             (tied ? " tied" : "") + " after " + std::to_string(updates) + " updates";
    const EvaluationRecord one_stage = evaluate(1, chunks, tied, updates);
    const EvaluationRecord staged = evaluate(pp, chunks, tied, updates);
    EXPECT_GT(one_stage.loss, 0.0) << what;
    EXPECT_EQ(staged.loss, one_stage.loss) << what;
    EXPECT_EQ(staged.loss_tokens, one_stage.loss_tokens) << what;
    EXPECT_EQ(staged.consumed_valid_samples, one_stage.consumed_valid_samples) << what;
  }
}

TEST(PipelineParallel, EveryRankReportsTheGlobalBatchsRecord) {
  Ranks ranks(pp_run(2, 2, 2));
  const std::vector<IterationRecord> records = ranks.run();
  ASSERT_EQ(records.size(), 8u);
  for (const IterationRecord& record : records) {
    EXPECT_EQ(record.loss, records.front().loss);
    EXPECT_EQ(record.grad_norm, records.front().grad_norm);
    EXPECT_EQ(record.clip_coeff, records.front().clip_coeff);
    EXPECT_EQ(record.input_tokens, records.front().input_tokens);
  }
  EXPECT_GT(records.front().loss, 0.0);
}

void expect_matches_the_reference(const RunConfig& config, std::int64_t updates, const std::string& what) {
  const equivalence::Report report = compare_with_the_reference(config, updates);
  EXPECT_TRUE(report.ok()) << what << "\n" << report.text();
}

TEST(PipelineParallel, UpdatesMatchTheReferenceOnEveryStageLayout) {
  expect_matches_the_reference(pp_run(2), 3, "PP 2");
  expect_matches_the_reference(pp_run(4), 2, "PP 4");
  RunConfig interleaved = pp_run(2);
  interleaved.parallel.virtual_pipeline_stages = 2;
  expect_matches_the_reference(interleaved, 2, "PP 2, 2 chunks a rank");
  RunConfig interleaved4 = pp_run(4);
  interleaved4.model.num_layers = 8;
  interleaved4.model.tie_embeddings = true;
  interleaved4.parallel.virtual_pipeline_stages = 2;
  expect_matches_the_reference(interleaved4, 2, "PP 4, 2 chunks a rank, tied");
  RunConfig uneven = pp_run(3);
  uneven.parallel.first_pipeline_stage_layers = 1;
  uneven.parallel.last_pipeline_stage_layers = 1;  // 1 + 2 + 1 layers
  expect_matches_the_reference(uneven, 2, "PP 3 uneven");
}

TEST(PipelineParallel, UpdatesMatchTheReferenceWithTiedEmbeddingsTensorAndDataParallelism) {
  RunConfig tied = pp_run(2);
  tied.model.tie_embeddings = true;
  tied.model.add_bias_linear = true;
  expect_matches_the_reference(tied, 3, "PP 2 tied, biases");
  RunConfig grid = pp_run(2, 2, 2);
  grid.model.tie_embeddings = true;
  grid.parallel.use_distributed_optimizer = true;
  grid.parallel.overlap_grad_reduce = true;
  grid.parallel.overlap_param_gather = true;
  grid.parallel.ddp_bucket_size = 3000;
  expect_matches_the_reference(grid, 2, "TP 2 x PP 2 x DP 2, SP, tied, distributed optimizer, overlap");
  RunConfig bf16 = pp_run(2, 1, 2);
  bf16.optimizer.bf16 = true;
  bf16.model.tie_embeddings = true;
  expect_matches_the_reference(bf16, 2, "PP 2 x DP 2 bf16 tied");
}

TEST(PipelineParallel, TheHarnessCatchesATiedEmbeddingNotSummedOrCountedTwice) {
  // Negative controls: each stage updating its copy with its own half of the gradient, and both
  // copies counted in the norm (clipping on, so the norm moves the update).
  RunConfig config = pp_run(2, 1, 2);
  config.model.tie_embeddings = true;
  config.parallel.use_distributed_optimizer = true;
  // Caught: a report that fails, or the trainer's own check that the two copies hold the same
  // bits (std::logic_error, as the harness's property sees it).
  const auto caught = [&](equivalence::Mutant mutant) {
    try {
      return !compare_with_the_reference(config, 2, equivalence::mutant_twin(mutant)).ok();
    } catch (const std::logic_error& error) {
      return std::string(error.what()).find("tied embedding") != std::string::npos;
    }
  };
  EXPECT_TRUE(compare_with_the_reference(config, 2).ok()) << "the correct twin must pass first";
  EXPECT_TRUE(caught(equivalence::Mutant::tied_embedding_not_summed))
      << "a tied embedding not summed over its stages was not caught";
  EXPECT_TRUE(caught(equivalence::Mutant::tied_embedding_counted_twice))
      << "a tied embedding counted twice in the norm was not caught";
}

TEST(PipelineParallel, TheHarnessCatchesAStageNormMicrobatchesOutOfOrderAndALastStageLocalLoss) {
  // issue 12's negative controls, each a report that fails on a layout where the correct twin
  // passes: a stage that clips by its own stage's norm (clipping on: pp_run's clip 0.5 is active),
  // the first stage's activations reaching the next stage out of order (4 microbatches a replica),
  // a last stage that normalizes each microbatch's loss by its own loss tokens.
  RunConfig config = pp_run(2, 1, 1);
  EXPECT_TRUE(compare_with_the_reference(config, 2).ok()) << "the correct twin must pass first";
  for (const equivalence::Mutant mutant : {equivalence::Mutant::stage_local_norm, equivalence::Mutant::microbatches_out_of_order,
                                           equivalence::Mutant::last_stage_microbatch_loss}) {
    const equivalence::Report report = compare_with_the_reference(config, 2, equivalence::mutant_twin(mutant));
    EXPECT_FALSE(report.ok()) << equivalence::to_string(mutant) << " was not caught";
  }
}

std::filesystem::path scratch(const std::string& name) { return testing::scratch_directory("pp-" + name); }

TEST(PipelineParallel, ResumeIsBitExactAndACheckpointIsReadAtOtherPipelineTensorAndDataSizes) {
  const std::filesystem::path directory = scratch("resume");
  RunConfig config = pp_run(2, 1, 2);
  config.model.tie_embeddings = true;
  config.parallel.use_distributed_optimizer = true;
  // The sharded save refuses ranges that overlap or leave gaps: the tied embedding saved once.
  const testing::SavedMidRun saved = testing::expect_resume_equals_straight(config, directory, "PP 2 x DP 2");
  const HostState& at_save = saved.at_save;
  EXPECT_EQ(saved.whole.params, std::vector<double>(at_save.params.begin(), at_save.params.end()));
  for (const auto& [pp, tp, dp] : {std::tuple{1, 1, 1}, std::tuple{4, 1, 1}, std::tuple{2, 2, 1}}) {
    RunConfig other = pp_run(pp, tp, dp);
    other.model.tie_embeddings = true;
    Ranks reshard(other);
    reshard.resume_from(directory);
    expect_same_state(reshard.state(), at_save,
                      "read at PP " + std::to_string(pp) + " x TP " + std::to_string(tp) + " x DP " + std::to_string(dp));
  }
  std::filesystem::remove_all(directory);
}

TEST(PipelineParallel, EachStageKeepsItsLayersActivationsForTheMicrobatchesIn1F1BsFlight) {
  // Exact: a stage allocates BlockActivations for its own layers only, once per activation slot,
  // and 1F1B gives stage s min(PP - s, M) slots (the plan's first-stage count: PP 2, M 4 -> 2).
  const RunConfig one = pp_run(1);
  Ranks whole(one);
  const std::int64_t per_layer = whole.ranks.front().model().activation_bytes_per_layer();
  const std::int64_t all = whole.ranks.front().model().allocated_bytes();  // 1 slot, 4 layers
  // One slot's inputs: tokens, labels, positions, attention starts (int32) and the loss mask (one
  // byte) per row, and the RoPE cosines and sines (fp32, hd/2 per row).
  const std::int64_t rows = one.batch.micro_batch_size * one.model.seq_length;
  const std::int64_t inputs = rows * (4 * 4 + 1) + 2 * rows * (one.model.head_dim() / 2) * 4;
  Ranks halves(pp_run(2));
  halves.ranks.each([&](Trainer& trainer, int) {
    const std::int64_t slots = trainer.pipeline_stage() == 0 ? 2 : 1;
    EXPECT_EQ(trainer.model().activation_slots(), slots) << "stage " << trainer.pipeline_stage();
    EXPECT_EQ(trainer.model().activation_bytes_per_layer(), per_layer);
    // The shared buffers as one stage's, then per slot its inputs and its 2 layers.
    EXPECT_EQ(trainer.model().allocated_bytes(), all - 4 * per_layer - inputs + slots * (inputs + 2 * per_layer))
        << "stage " << trainer.pipeline_stage();
  });
}


// ---- Activation recomputation (Megatron's --recompute-granularity full / selective) ----

RunConfig recomputing(RunConfig config, RecomputeGranularity granularity, RecomputeMethod method,
                      std::int64_t layers) {
  config.recompute.granularity = granularity;
  config.recompute.method = method;
  config.recompute.num_layers = granularity == RecomputeGranularity::full ? layers : 0;
  return config;
}

std::string describe(const RecomputeConfig& recompute) {
  return to_string(recompute.granularity) +
         (recompute.granularity == RecomputeGranularity::full
              ? " " + to_string(recompute.method) + " " + std::to_string(recompute.num_layers)
              : "");
}

TEST(Recompute, EveryMethodIsBitwiseTheRunThatStoresEverything) {
  // The recomputed forward is the first forward's operations on the same bytes: losses, norms and
  // states equal bit for bit, on one stage, pipelined (1F1B and interleaved), with TP + SP, and
  // in bf16; groups that divide the chunk, that do not, and larger than it.
  struct Layout {
    std::int64_t pp, tp, chunks, layers;
    bool bf16;
  };
  for (const Layout layout : {Layout{1, 1, 1, 5, false}, Layout{2, 1, 1, 6, false}, Layout{2, 1, 2, 8, false},
                              Layout{1, 2, 1, 3, false}, Layout{2, 1, 1, 4, true}}) {
    RunConfig base = pp_run(layout.pp, layout.tp);
    base.model.num_layers = layout.layers;
    base.parallel.virtual_pipeline_stages = layout.chunks;
    base.optimizer.bf16 = layout.bf16;
    const auto run = [](const RunConfig& config) {
      Ranks ranks(config);
      std::vector<IterationRecord> records;
      for (int i = 0; i < 2; ++i) records.push_back(ranks.run().front());
      return std::make_pair(records, ranks.state());
    };
    const auto [stored_records, stored_state] = run(base);
    for (const RecomputeConfig recompute :
         {RecomputeConfig{RecomputeGranularity::selective, RecomputeMethod::uniform, 0},
          RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 1},
          RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 2},
          RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 3},
          RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 9},
          RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::block, 1},
          RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::block, 2}}) {
      const RunConfig config = recomputing(base, recompute.granularity, recompute.method, recompute.num_layers);
      const auto [records, state] = run(config);
      const std::string what = "PP " + std::to_string(layout.pp) + " TP " + std::to_string(layout.tp) + " chunks " +
                               std::to_string(layout.chunks) + (layout.bf16 ? " bf16" : " fp32") + ", recompute " +
                               describe(recompute);
      for (std::size_t i = 0; i < records.size(); ++i) {
        EXPECT_EQ(records[i].loss, stored_records[i].loss) << what;
        EXPECT_EQ(records[i].grad_norm, stored_records[i].grad_norm) << what;
      }
      expect_same_state(state, stored_state, what);
    }
  }
}

TEST(Recompute, EachStageKeepsOnlyItsGroupsInputsAndRebuildsOneGroupAtATime) {
  // Exact, per stage: every activation slot keeps one whole BlockActivations per stored layer and
  // one block input per recomputed group; the scratch holds the largest group's whole blocks. The
  // plan counts the same: its stage bytes equal the model's (PP 2: the first stage holds 2
  // microbatches, the last 1; no logits on the first stage).
  RunConfig base = pp_run(2);
  base.model.num_layers = 8;  // 4 a stage
  Ranks stored(base);
  const std::int64_t whole = stored.ranks.front().model().activation_bytes_per_layer();
  const std::int64_t rows = base.batch.micro_batch_size * base.model.seq_length;
  const std::int64_t input = rows * base.model.hidden_size * 4;  // fp32 [rows, d]
  struct Expected {
    RecomputeMethod method;
    std::int64_t layers;
    std::int64_t inputs;   // kept per slot
    std::int64_t wholes;   // stored whole per slot
    std::int64_t scratch;  // whole blocks rebuilt at once
  };
  for (const Expected expected : {Expected{RecomputeMethod::uniform, 1, 4, 0, 1}, Expected{RecomputeMethod::uniform, 3, 2, 0, 3},
                                  Expected{RecomputeMethod::uniform, 4, 1, 0, 4}, Expected{RecomputeMethod::block, 1, 1, 3, 1},
                                  Expected{RecomputeMethod::block, 3, 3, 1, 1}}) {
    const RunConfig config = recomputing(base, RecomputeGranularity::full, expected.method, expected.layers);
    const std::string what = describe(config.recompute);
    Ranks ranks(config);
    ranks.ranks.each([&](Trainer& trainer, int) {
      const std::int64_t slots = trainer.model().activation_slots();
      EXPECT_EQ(trainer.model().activation_bytes_per_layer(), whole) << what;
      EXPECT_EQ(trainer.model().stored_activation_bytes(),
                slots * (expected.inputs * input + expected.wholes * whole) + expected.scratch * whole)
          << what << ", stage " << trainer.pipeline_stage();
    });
    // The plan's first stage, from the same rules.
    RunConfig planned = config;
    planned.parallel.data_parallel = 1;
    const StageMemory first = make_plan(planned, PlanOptions{}).memory.stages.front();
    std::int64_t model_first = 0;
    ranks.ranks.each([&](Trainer& trainer, int) {
      if (trainer.pipeline_stage() == 0) model_first = trainer.model().stored_activation_bytes();
    });
    EXPECT_DOUBLE_EQ(first.activations_gib * 1024.0 * 1024.0 * 1024.0, static_cast<double>(model_first)) << what;
  }
  // And without recomputation, the same rule: every layer whole in every slot, no scratch.
  stored.ranks.each([&](Trainer& trainer, int) {
    EXPECT_EQ(trainer.model().stored_activation_bytes(), trainer.model().activation_slots() * 4 * whole);
  });
}


TEST(Recompute, EachStagesMeasuredPeakIsThePlansWithinOnePercent) {
  // issue 12 asks for 10%; measured 0.26-0.35% here (and 0.03-0.04% at d 256, s 256, 8 layers).
  // The bytes each stage's backend holds at its peak (weights, main gradients, optimizer
  // state, activations, working buffers: every Buffer counts itself) against the plan's stage
  // total, with and without recomputation, fp32 and bf16. The plan's working buffers are the
  // model's own buffers besides its stored activations, plus the trainer's per-position losses
  // and pipeline send/receive buffers, exactly; what it leaves out (the data-parallel and TP
  // exchange scratch, the norm's partial sums) is the difference. Interleaved (2 chunks a stage)
  // too: the stored activations are the plan's exactly, a chunk slot per (microbatch, chunk) in
  // flight (PP 2, M 4: 5 on the first stage, Megatron's warmup + 1, where a slot per microbatch
  // holding both chunks would keep 3 x 2).
  for (const std::int64_t chunks : {1, 2}) {
    for (const bool bf16 : {false, true}) {
      for (const RecomputeGranularity granularity : {RecomputeGranularity::none, RecomputeGranularity::full}) {
        RunConfig config = recomputing(pp_run(2), granularity, RecomputeMethod::uniform, 1);
        config.model.num_layers = 8;
        config.parallel.virtual_pipeline_stages = chunks;
        config.optimizer.bf16 = bf16;
        const std::string what = std::string(bf16 ? "bf16" : "fp32") + ", recompute " + describe(config.recompute) +
                                 ", " + std::to_string(chunks) + " chunks a stage";
        const Plan plan = make_plan(config, PlanOptions{});
        Ranks ranks(config);
        ranks.run();
        const std::int64_t rows = config.batch.micro_batch_size * config.model.seq_length;
        const std::int64_t stream_bytes = rows * config.model.hidden_size * (bf16 ? 2 : 4);
        ranks.ranks.each([&](Trainer& trainer, int) {
          const StageMemory& planned = plan.memory.stages.at(static_cast<std::size_t>(trainer.pipeline_stage()));
          const double gib = 1024.0 * 1024.0 * 1024.0;
          const std::int64_t working = trainer.model().allocated_bytes() - trainer.model().stored_activation_bytes() +
                                       config.microbatches_per_replica() * rows * 4 + 4 * stream_bytes;
          EXPECT_DOUBLE_EQ(planned.working_gib * gib, static_cast<double>(working)) << what << ", " << planned.stage;
          EXPECT_DOUBLE_EQ(planned.activations_gib * gib, static_cast<double>(trainer.model().stored_activation_bytes()))
              << what << ", " << planned.stage;
          EXPECT_DOUBLE_EQ(planned.activations_in_flight * static_cast<double>(chunks),
                           static_cast<double>(trainer.model().chunk_slots()))
              << what << ", " << planned.stage;
          if (chunks == 2 && trainer.pipeline_stage() == 0) {
            EXPECT_EQ(trainer.model().chunk_slots(), 5) << what;
          }
          const double measured = static_cast<double>(trainer.backend().peak_bytes_in_use());
          // The plan leaves some scratch out: it is a lower bound, and a tight one.
          EXPECT_GE(measured, planned.total_gib * gib) << what << ", " << planned.stage;
          EXPECT_LE(measured / (planned.total_gib * gib), 1.01)
              << what << ", " << planned.stage << " stage: measured " << measured << " bytes, planned "
              << planned.total_gib * gib;
        });
      }
    }
  }
}

}  // namespace
}  // namespace tandem
