// Megatron's layers per pipeline stage and chunk (core/pipeline_layout.hpp), held against a
// transcription of Megatron Core's own two functions, get_num_layers_to_build (transformer_block.py)
// and get_transformer_layer_offset (transformer_layer.py), on every small layout they accept.
#include "core/pipeline_layout.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/args.hpp"
#include "tests/support/parse_run.hpp"

namespace tandem {
namespace {

// Megatron Core's get_num_layers_to_build and get_transformer_layer_offset, written from their
// definitions (not from tandem's code): first/last 0 stand for None, v = 1 for no interleaving.
struct MegatronStage {
  std::int64_t count = 0;
  std::int64_t offset = 0;
  // Megatron's interleaved uneven offset divides by the number of middle stages, which is 0 when
  // PP = 2 sets both the first and the last stage: Python raises ZeroDivisionError there (a
  // Megatron bug; tandem's offsets, the sums of the counts before, are defined).
  bool offset_defined = true;
};

MegatronStage megatron_stage(const PipelineSplit& s, std::int64_t pp_rank, std::int64_t vp_stage) {
  const std::int64_t pp = s.pipeline;
  const std::int64_t vp = s.virtual_stages;
  MegatronStage out;
  if (s.first_stage_layers > 0 || s.last_stage_layers > 0) {
    std::int64_t to_distribute = s.num_layers;
    std::int64_t stages_left = pp;
    if (s.first_stage_layers > 0) { to_distribute -= s.first_stage_layers; --stages_left; }
    if (s.last_stage_layers > 0) { to_distribute -= s.last_stage_layers; --stages_left; }
    std::int64_t per_rank = stages_left > 0 ? to_distribute / stages_left : 0;
    if (pp_rank == 0 && s.first_stage_layers > 0) per_rank = s.first_stage_layers;
    if (pp_rank == pp - 1 && s.last_stage_layers > 0) per_rank = s.last_stage_layers;
    out.count = per_rank / vp;
    // Offset, uneven branch.
    const std::int64_t middle_layers = s.num_layers - s.first_stage_layers - s.last_stage_layers;
    const std::int64_t middle_rank = s.first_stage_layers > 0 ? pp_rank - 1 : pp_rank;
    const std::int64_t first_per_chunk = s.first_stage_layers / vp;
    const std::int64_t last_per_chunk = s.last_stage_layers / vp;
    const std::int64_t middle_per_chunk = middle_layers / vp;
    if (vp > 1) {
      const std::int64_t total = first_per_chunk + middle_per_chunk + last_per_chunk;
      if (pp_rank != 0 && stages_left == 0) {
        out.offset_defined = false;
        return out;
      }
      out.offset = pp_rank == 0 ? vp_stage * total
                                : vp_stage * total + first_per_chunk + middle_rank * (middle_per_chunk / stages_left);
    } else {
      const std::int64_t middle_per_rank = stages_left > 0 ? middle_layers / stages_left : 0;
      out.offset = pp_rank == 0 ? 0 : middle_rank * middle_per_rank + s.first_stage_layers;
    }
    return out;
  }
  std::int64_t num_layers = s.num_layers + s.account_for_embedding + s.account_for_loss;
  const std::int64_t per_rank = num_layers / pp;
  out.count = per_rank / vp;
  // "The embedding (or loss) layer cannot function as a standalone transformer layer".
  if (s.account_for_embedding && pp_rank == 0 && vp_stage == 0) --out.count;
  if (s.account_for_loss && pp_rank == pp - 1 && vp_stage == vp - 1) --out.count;
  if (pp == 1) {
    out.offset = 0;
  } else if (vp > 1) {
    out.offset = vp_stage * (num_layers / vp) + pp_rank * (per_rank / vp);
    if (s.account_for_embedding && !(vp_stage == 0 && pp_rank == 0)) --out.offset;
  } else {
    out.offset = pp_rank * per_rank;
    if (s.account_for_embedding && pp_rank != 0) --out.offset;
  }
  return out;
}

std::optional<PipelineStages> try_stages(const PipelineSplit& split) {
  try {
    return PipelineStages(split);
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

TEST(PipelineLayout, EveryAcceptedSmallLayoutIsMegatronsCountAndOffsetAndTilesTheLayers) {
  std::int64_t accepted = 0;
  for (std::int64_t layers = 1; layers <= 16; ++layers) {
    for (std::int64_t pp = 1; pp <= 6; ++pp) {
      for (std::int64_t v = 1; v <= 4; ++v) {
        for (std::int64_t first = 0; first <= layers; ++first) {
          for (std::int64_t last = 0; last <= layers; ++last) {
            for (int account = 0; account < 4; ++account) {
              PipelineSplit split{layers, pp, v, first, last, (account & 1) != 0, (account & 2) != 0};
              const auto stages = try_stages(split);
              if (!stages) continue;
              ++accepted;
              std::int64_t next = 0;  // chunk-major order of the virtual stages
              for (std::int64_t chunk = 0; chunk < v; ++chunk) {
                for (std::int64_t stage = 0; stage < pp; ++stage) {
                  const LayerRange range = stages->layers(stage, chunk);
                  const MegatronStage megatron = megatron_stage(split, stage, chunk);
                  SCOPED_TRACE("L " + std::to_string(layers) + " PP " + std::to_string(pp) + " v " +
                               std::to_string(v) + " first " + std::to_string(first) + " last " +
                               std::to_string(last) + " account " + std::to_string(account) + " stage " +
                               std::to_string(stage) + " chunk " + std::to_string(chunk));
                  ASSERT_EQ(range.size(), megatron.count);
                  if (megatron.offset_defined) {
                    ASSERT_EQ(range.begin, megatron.offset);
                  }
                  ASSERT_EQ(range.begin, next);
                  ASSERT_GE(range.size(), 0);
                  for (std::int64_t layer = range.begin; layer < range.end; ++layer) {
                    ASSERT_EQ(stages->stage_of_layer(layer), stage);
                    ASSERT_EQ(stages->chunk_of_layer(layer), chunk);
                  }
                  next = range.end;
                }
              }
              ASSERT_EQ(next, layers);
            }
          }
        }
      }
    }
  }
  // Not vacuous: the even split alone gives dozens, the uneven and accounted forms hundreds.
  EXPECT_GT(accepted, 500);
}

TEST(PipelineLayout, MegatronsInterleavingExamples) {
  // transformer_block.py's comment: 8 layers, 2 stages, 4 chunks: [0] [2] [4] [6] / [1] [3] [5] [7].
  const PipelineStages four({8, 2, 4});
  for (std::int64_t chunk = 0; chunk < 4; ++chunk) {
    EXPECT_EQ(four.layers(0, chunk), (LayerRange{2 * chunk, 2 * chunk + 1}));
    EXPECT_EQ(four.layers(1, chunk), (LayerRange{2 * chunk + 1, 2 * chunk + 2}));
  }
  // 2 chunks: [0, 1] [4, 5] / [2, 3] [6, 7].
  const PipelineStages two({8, 2, 2});
  EXPECT_EQ(two.layers(0, 0), (LayerRange{0, 2}));
  EXPECT_EQ(two.layers(0, 1), (LayerRange{4, 6}));
  EXPECT_EQ(two.layers(1, 0), (LayerRange{2, 4}));
  EXPECT_EQ(two.layers(1, 1), (LayerRange{6, 8}));
  EXPECT_EQ(two.describe(1), "layers 2-3, 6-7");
  EXPECT_TRUE(PipelineStages::holds_embedding(0, 0));
  EXPECT_FALSE(PipelineStages::holds_embedding(0, 1));
  EXPECT_TRUE(two.holds_output(1, 1));
  EXPECT_FALSE(two.holds_output(1, 0));
}

TEST(PipelineLayout, TheSeedsStagesAndAnUnevenSplit) {
  // The seed: 112 layers on PP 8, 14 a stage; GPU 4,097 is on stage 6.
  const PipelineStages seed({112, 8, 1});
  EXPECT_EQ(seed.layers(6, 0), (LayerRange{6 * 14, 7 * 14}));
  EXPECT_EQ(seed.describe(6), "layers 84-97");
  // 30 layers, first 2 and last 4, 4 middle stages of 6.
  const PipelineStages uneven({30, 6, 1, 2, 4});
  EXPECT_EQ(uneven.layers(0, 0), (LayerRange{0, 2}));
  EXPECT_EQ(uneven.layers(1, 0), (LayerRange{2, 8}));
  EXPECT_EQ(uneven.layers(5, 0), (LayerRange{26, 30}));
  // The embedding and loss counted as layers: 6 layers + 2 on PP 4 = 2 a stage, one fewer at the ends.
  const PipelineStages accounted({6, 4, 1, 0, 0, true, true});
  EXPECT_EQ(accounted.layers(0, 0), (LayerRange{0, 1}));
  EXPECT_EQ(accounted.layers(1, 0), (LayerRange{1, 3}));
  EXPECT_EQ(accounted.layers(3, 0), (LayerRange{5, 6}));
  EXPECT_EQ(accounted.describe(3), "layer 5");
  // A stage may hold only the loss: 1 layer + 1 on PP 2.
  const PipelineStages loss_only({1, 2, 1, 0, 0, false, true});
  EXPECT_EQ(loss_only.describe(1), "no decoder layer");
}

// The message of the first issue a split raises (empty when it is accepted).
std::string first_issue(const PipelineSplit& split) {
  try {
    (void)PipelineStages(split);
    return "";
  } catch (const ConfigError& error) {
    const ConfigIssue& issue = error.issues().front();
    return issue.field + " = " + issue.value + ": " + issue.rule;
  }
}

TEST(PipelineLayout, MegatronsRulesAreRefusedNamingTheOption) {
  EXPECT_EQ(first_issue({10, 4, 1}),
            "--num-layers = 10: must be divisible by --pipeline-model-parallel-size (4)");
  EXPECT_NE(first_issue({8, 2, 3}).find("must divide into its model chunks (3)"), std::string::npos);
  EXPECT_NE(first_issue({8, 1, 2}).find("--num-virtual-stages-per-pipeline-rank = 2"), std::string::npos);
  EXPECT_NE(first_issue({8, 3, 1, 2, 0, true, false}).find("cannot be set together"), std::string::npos);
  EXPECT_NE(first_issue({8, 3, 2, 3, 0}).find("--decoder-first-pipeline-num-layers = 3: must be divisible"),
            std::string::npos);
  EXPECT_NE(first_issue({9, 4, 1, 3, 3}).find("must divide evenly over the 2 middle stages"), std::string::npos);
  EXPECT_NE(first_issue({8, 2, 1, 3, 3}).find("both must be zero or neither"), std::string::npos);
  EXPECT_NE(first_issue({8, 3, 1, 4, 6}).find("exceeds --num-layers (8)"), std::string::npos);
  EXPECT_NE(first_issue({8, 1, 1, 2, 0}).find("needs --pipeline-model-parallel-size > 1"), std::string::npos);
  EXPECT_EQ(first_issue({8, 2, 1, 3, 5}), "");
}

TEST(PipelineLayout, TheCommandLineReachesTheSplit) {
  // Through build_run_config, as `tandem plan` and `tandem train` read it.
  const auto config = [](std::vector<std::string> arguments) {
    arguments.insert(arguments.end(), {"--train-samples", "64"});
    return testing::parse_run(arguments);
  };
  const RunConfig uneven = config({"--num-layers", "10", "--pipeline-model-parallel-size", "4",
                                   "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers",
                                   "3", "--world-size", "4"});
  const PipelineStages stages(pipeline_split(uneven.model, uneven.parallel));
  EXPECT_EQ(stages.layers(0, 0), (LayerRange{0, 1}));
  EXPECT_EQ(stages.layers(1, 0), (LayerRange{1, 4}));
  EXPECT_EQ(stages.layers(3, 0), (LayerRange{7, 10}));
  const RunConfig interleaved = config({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                                        "--num-virtual-stages-per-pipeline-rank", "2", "--world-size", "2",
                                        "--micro-batch-size", "1", "--global-batch-size", "4"});
  EXPECT_EQ(interleaved.parallel.virtual_pipeline_stages, 2);
  // Megatron's interleaved schedule runs groups of PP microbatches: 3 per replica on 2 stages
  // leave a last group of 1.
  try {
    (void)config({"--num-layers", "8", "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                  "2", "--world-size", "2", "--micro-batch-size", "1", "--global-batch-size", "3"});
    ADD_FAILURE() << "3 microbatches on 2 interleaved stages were accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.issues().front().field, "--global-batch-size");
    EXPECT_EQ(error.issues().front().rule,
              "the interleaved schedule's microbatches per replica (3) must be a multiple of "
              "--pipeline-model-parallel-size (2): the last group would hold 1 (Megatron); microbatches per "
              "replica = GBS / (--micro-batch-size x DP) = 3");
  }
  try {
    (void)config({"--num-layers", "10", "--pipeline-model-parallel-size", "4", "--world-size", "4"});
    ADD_FAILURE() << "10 layers on 4 stages were accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.issues().front().field, "--num-layers");
  }
  try {
    (void)config({"--num-layers", "8", "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers",
                  "2", "--num-layers-per-virtual-pipeline-stage", "1", "--world-size", "2"});
    ADD_FAILURE() << "layers per chunk with an uneven stage were accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.issues().front().rule, "cannot express chunks with an uneven first or last stage (Megatron)");
  }
}

}  // namespace
}  // namespace tandem
