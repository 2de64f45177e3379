// Tensor parallelism through the binary, as users run it (issue: "mpirun -np 2 tandem train
// --tensor-model-parallel-size 2 --sequence-parallel ..." and "mpirun -np 4" with TP2 x DP2):
// each rank's groups are MPI sub-communicators of the rank grid (core/rank_grid.hpp); the runs
// train, checkpoint, resume bit-exactly, export, and a checkpoint written at one layout resumes at
// others. Skipped when mpirun is absent.
// Kind of comparison: exact (exit codes, header fields, bytes of checkpoint tensors, exported
// tensors against the checkpoint's).
#include <algorithm>
#include <filesystem>
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

// The tiny run: 4 heads in 2 groups, F 64, which TP 2 and 4 split.
class TensorParallelCli : public testing::ModelParallelCli {};

TEST_F(TensorParallelCli, TwoMpiRanksWithSequenceParallelismTrainResumeBitExactlyAndExport) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  const auto resumed =
      expect_resume_equals_straight("tp2", [&](std::vector<std::string> extra) { return tiny(joined(layout, extra)); },
                                    2, 6, mpirun);
  const auto straight = root_ / "tp2-straight";
  const auto header = read_log(straight / "log.jsonl").at(0);
  EXPECT_EQ(header["tensor_parallel"]["ranks"], 2) << header.dump();
  EXPECT_EQ(header["tensor_parallel"]["sequence_parallel"], true) << header.dump();
  EXPECT_NE(header["tensor_parallel"]["collectives"].get<std::string>().find("tensor group of 2 ranks"),
            std::string::npos)
      << header.dump();
  EXPECT_EQ(header["data_parallel"]["ranks"], 1) << header.dump();

  // The export gathers the whole tensors: each exported tensor is the checkpoint's, the padded
  // vocabulary Megatron's round_up(258, 128 x TP) = 512 rows.
  checkpoint::SafetensorsContents hf;
  ASSERT_NO_FATAL_FAILURE(expect_export_holds_the_checkpoint(resumed, hf));
  EXPECT_EQ(checkpoint::find_tensor(hf.tensors, "model.embed_tokens.weight", "export").shape,
            (std::vector<std::int64_t>{512, 32}));
}

TEST_F(TensorParallelCli, TensorTimesDataParallelOnFourMpiRanksResumesBitExactlyAndAudits) {
  const std::string mpirun = testing::mpirun_prefix(4);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--use-distributed-optimizer", "--overlap-grad-reduce",
                                           "--bf16", "--audit-params", "6"};
  expect_resume_equals_straight("tp2dp2", [&](std::vector<std::string> extra) { return tiny(joined(layout, extra)); },
                                3, 6, mpirun);
  const auto log = root_ / "tp2dp2-straight" / "log.jsonl";
  const auto header = read_log(log).at(0);
  EXPECT_EQ(header["tensor_parallel"]["ranks"], 2) << header.dump();
  EXPECT_EQ(header["data_parallel"]["ranks"], 2) << header.dump();
  EXPECT_NE(header["data_parallel"]["collectives"].get<std::string>().find("data group of 2 ranks"), std::string::npos)
      << header.dump();
  // Every record names the global batch: 4 samples x 32 tokens, whatever the layout.
  for (const auto& record : read_log(log)) {
    if (record["type"] == "iteration") {
      EXPECT_EQ(record["input_tokens"], 4 * 32) << record.dump();
    }
  }
  const auto audit = run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
}

// SPEC 13: a checkpoint resumes on another TP and DP by the full tensors' flat ranges. Written
// at TP 2 (3 updates), taken up by one process (TP 1, with --make-vocab-size-divisible-by 256 so
// the padded vocabulary is the same 512 rows), by TP 4 and by TP 2 x DP 2, each to the end.
TEST_F(TensorParallelCli, ACheckpointOfTwoTensorRanksResumesOnOtherLayouts) {
  const std::string mpirun2 = testing::mpirun_prefix(2);
  const std::string mpirun4 = testing::mpirun_prefix(4);
  if (mpirun2.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto half = root_ / "half";
  const auto first = run_tandem(tiny({"--tensor-model-parallel-size", "2", "--save", half.string(), "--exit-interval", "3"}),
                                mpirun2, "2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  expect_resumes_on(half,
                    {Layout{"tp1", "", {"--make-vocab-size-divisible-by", "256"}},
                     Layout{"tp4", mpirun4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
                     Layout{"tp2dp2", mpirun4, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}}});
  // tandem check --load starts both twins from the TP 2 checkpoint (the production twin on TP 2
  // ranks of threads, the reference whole).
  std::vector<std::string> check = tiny_train({}, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                   "--load", half.string(), "--updates", "1"});
  check.front() = "check";
  check.erase(std::find(check.begin(), check.end(), "--quiet"));
  const auto checked = run_tandem(check, "", "2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find("at iteration 3"), std::string::npos) << checked.output;
  EXPECT_NE(checked.output.find("verdict: the twins agree"), std::string::npos) << checked.output;
  // TP 1 with the default padding (384 rows) cannot hold the 512-row tensors: refused, naming
  // both layouts and the divisor that fits.
  const auto refused = run_tandem(tiny({"--load", half.string()}), "", "2>&1");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  for (const char* words : {"384 rows", "this run's layout TP 1 x DP 1 x PP 1", "512 rows",
                            "written at TP 2 x DP 1 x PP 1", "add --make-vocab-size-divisible-by 256"}) {
    EXPECT_NE(refused.output.find(words), std::string::npos) << words << "\n" << refused.output;
  }
}

TEST_F(TensorParallelCli, TensorRanksWithoutALauncherAreRefusedNamingTheCommand) {
  expect_two_ranks_refused_without_a_launcher("--tensor-model-parallel-size");
}

}  // namespace
}  // namespace tandem
