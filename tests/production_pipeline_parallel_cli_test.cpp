// Pipeline parallelism through the binary, as users run it ("mpirun -np 8 tandem train
// --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2
// --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather ..."): each rank's
// pipeline and embedding groups are MPI sub-communicators of the rank grid; the runs train,
// checkpoint, resume bit-exactly and export, and a checkpoint written at one layout resumes at
// others. Skipped when mpirun is absent.
// Kind of comparison: exact (exit codes, header fields, bytes of checkpoint tensors, exported
// tensors against the checkpoint's).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "tests/support/files.hpp"
#include "tests/support/model_parallel_cli.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

using testing::read_log;
using testing::run_tandem;
using testing::tensor_files_of;

// The tiny run: 2 layers, tied embeddings as Megatron's default.
class PipelineParallelCli : public testing::ModelParallelCli {};

TEST_F(PipelineParallelCli, TwoStagesOnTwoMpiRanksTrainResumeBitExactlyAndExport) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const std::vector<std::string> layout = {"--pipeline-model-parallel-size", "2"};
  const auto resumed =
      expect_resume_equals_straight("pp2", [&](std::vector<std::string> extra) { return tiny(joined(layout, extra)); },
                                    2, 6, mpirun);
  const auto header = read_log(root_ / "pp2-straight" / "log.jsonl").at(0);
  EXPECT_EQ(header["pipeline_parallel"]["ranks"], 2) << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["stages"][0], "stage 0: the embedding, layer 0") << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["stages"][1], "stage 1: layer 1, the final norm, output layer and loss")
      << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["schedule"], "1F1B (Megatron's, not interleaved)") << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["activation_slots"], 2) << header.dump();  // stage 0: min(PP, M) = 2
  EXPECT_NE(header["pipeline_parallel"]["collectives"].get<std::string>().find("pipeline group of 2 ranks"),
            std::string::npos)
      << header.dump();
  // The export holds every stage's tensors once: each exported tensor is the checkpoint's.
  checkpoint::SafetensorsContents hf;
  ASSERT_NO_FATAL_FAILURE(expect_export_holds_the_checkpoint(resumed, hf));
}

TEST_F(PipelineParallelCli, InterleavedStagesOnTwoMpiRanksTrainAndResumeBitExactly) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  // 4 layers, 2 chunks a rank (stage 0: layers 0 and 2), 4 microbatches a replica: Megatron's
  // interleaved 1F1B with its steady steps.
  const std::vector<std::string> layout = {"--pipeline-model-parallel-size", "2", "--num-layers", "4",
                                           "--num-virtual-stages-per-pipeline-rank", "2", "--micro-batch-size", "1",
                                           "--log-pipeline-timeline"};
  expect_resume_equals_straight("vp2", [&](std::vector<std::string> extra) { return tiny(joined(layout, extra)); },
                                2, 6, mpirun);
  const auto log = root_ / "vp2-straight" / "log.jsonl";
  const auto records = read_log(log);
  const auto& header = records.at(0);
  EXPECT_EQ(header["pipeline_parallel"]["schedule"], "interleaved 1F1B (Megatron's, groups of 2 microbatches)")
      << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["model_chunks_per_rank"], 2) << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["stages"][0], "stage 0: the embedding, layers 0, 2") << header.dump();
  // --log-pipeline-timeline: a timeline after each iteration's record, every stage's 2 x 2 x 4 passes.
  std::int64_t timelines = 0;
  for (std::size_t i = 1; i < records.size(); ++i) {
    if (records[i]["type"] != "pipeline_timeline") continue;
    ++timelines;
    EXPECT_EQ(records[i - 1]["type"], "iteration") << records[i].dump();
    EXPECT_EQ(records[i]["iteration"], records[i - 1]["iteration"]) << records[i].dump();
    EXPECT_EQ(records[i]["stages"].size(), 2u) << records[i].dump();
    EXPECT_EQ(records[i]["stages"][1]["passes"].size(), 16u) << records[i].dump();
    EXPECT_DOUBLE_EQ(records[i]["plan_idle_fraction"].get<double>(), 1.0 / 9.0) << records[i].dump();  // (2-1)/(2x4+1)
  }
  EXPECT_EQ(timelines, 6);
  // `tandem timeline` reads it and draws it.
  const auto shown = run_tandem({"timeline", log.string(), "--iteration", "3", "--svg", (root_ / "t.svg").string()},
                                "", "2>&1");
  ASSERT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_NE(shown.output.find("iteration 3: 2 pipeline stages x 2 model chunks, 4 microbatches per replica"),
            std::string::npos)
      << shown.output;
  EXPECT_NE(shown.output.find("the plan's bubble 11.1%"), std::string::npos) << shown.output;
  EXPECT_NE(testing::bytes_of(root_ / "t.svg").find("</svg>"), std::string::npos);
  // A log without timelines says how to get them; a missing one, that it cannot be read.
  const auto untimed = root_ / "untimed.jsonl";
  {
    std::ofstream out(untimed);
    out << header.dump() << "\n";
  }
  const auto none = run_tandem({"timeline", untimed.string()}, "", "2>&1");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("holds no pipeline_timeline record; fix: train with --pipeline-model-parallel-size > 1 "
                             "and --log-pipeline-timeline"),
            std::string::npos)
      << none.output;
  const auto missing = run_tandem({"timeline", (root_ / "missing.jsonl").string()}, "", "2>&1");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot read"), std::string::npos) << missing.output;
}

TEST_F(PipelineParallelCli, TheSeedsLayoutInMiniatureOnEightMpiRanksResumesBitExactly) {
  const std::string mpirun = testing::mpirun_prefix(8);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--pipeline-model-parallel-size", "2", "--use-distributed-optimizer",
                                           "--overlap-grad-reduce", "--overlap-param-gather", "--audit-params", "6"};
  // With Megatron's full recomputation (one layer a group): a memory option, no result changes.
  const std::vector<std::string> recompute = {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                              "--recompute-num-layers", "1"};
  expect_resume_equals_straight(
      "tp2pp2dp2", [&](std::vector<std::string> extra) { return tiny(joined(joined(layout, recompute), extra)); }, 3, 6,
      mpirun);
  const auto stored = run_tandem(tiny(joined(layout, {"--save", (root_ / "stored").string()})), mpirun, "2>&1");
  ASSERT_EQ(stored.exit_code, 0) << stored.output;
  EXPECT_EQ(tensor_files_of(root_ / "stored" / "iter_0000006"), tensor_files_of(root_ / "tp2pp2dp2-straight" / "iter_0000006"))
      << "the recomputing run's checkpoint differs from the one that stores every activation";
  const auto log = root_ / "tp2pp2dp2-straight" / "log.jsonl";
  const auto header = read_log(log).at(0);
  EXPECT_EQ(header["tensor_parallel"]["ranks"], 2) << header.dump();
  EXPECT_EQ(header["pipeline_parallel"]["ranks"], 2) << header.dump();
  EXPECT_EQ(header["data_parallel"]["ranks"], 2) << header.dump();
  // Every sampled AdamW update, whichever stage holds it, recomputed in 50 digits.
  const auto audited = run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_EQ(audited.exit_code, 0) << audited.output;
}

TEST_F(PipelineParallelCli, ACheckpointOfTwoStagesResumesOnOtherLayouts) {
  const std::string mpirun2 = testing::mpirun_prefix(2);
  const std::string mpirun4 = testing::mpirun_prefix(4);
  if (mpirun2.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto half = root_ / "half";
  const auto first = run_tandem(tiny({"--pipeline-model-parallel-size", "2", "--save", half.string(),
                                      "--exit-interval", "3"}),
                                mpirun2, "2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  expect_resumes_on(half,
                    {Layout{"pp1", "", {}},
                     Layout{"pp2dp2", mpirun4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},
                     Layout{"tp2", mpirun2, {"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"}}});
}

TEST_F(PipelineParallelCli, StagesWithoutALauncherAreRefusedNamingTheCommand) {
  expect_two_ranks_refused_without_a_launcher("--pipeline-model-parallel-size");
}

}  // namespace
}  // namespace tandem
