// `tandem check` through the real binary (SPEC 12): it names the twins it compares, prints both
// values, the error and the bound per update and quantity, and its exit status is the verdict.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

// A tiny run on the embedded corpus, built once into the test's temporary directory.
std::vector<std::string> tiny_check(std::vector<std::string> extra) {
  std::vector<std::string> arguments = {
      "check", "--train-samples", "16", "--num-layers", "1", "--hidden-size", "8",
      "--num-attention-heads", "2", "--ffn-hidden-size", "16", "--seq-length", "8",
      "--global-batch-size", "4", "--micro-batch-size", "2", "--clip-grad", "0.5",
      "--data-cache", (std::filesystem::path(::testing::TempDir()) / "tandem-check-corpus").string()};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  return arguments;
}

TEST(CheckCommand, ProductionAgreesWithTheReferenceAndTheReportNamesTwinsValuesErrorsAndBounds) {
  const auto result = testing::run_tandem(tiny_check({"--updates", "2"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("production<cpu, fp32>"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("[fast twin] vs reference<double>"), std::string::npos);
  EXPECT_NE(result.output.find("-- update 2: ok"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("update 2 params"), std::string::npos);
  EXPECT_NE(result.output.find("% of the bound"), std::string::npos);
  // Each bounded quantity's sharpness (issue 15 item 2), so a loose bound is visible.
  for (const char* quantity : {"gradient", "grad_norm", "loss", "params", "exp_avg", "exp_avg_sq"}) {
    EXPECT_NE(result.output.find(std::string("sharpness (error / bound) ") + quantity + ": "),
              std::string::npos) << quantity << "\n" << result.output;
  }
  EXPECT_NE(result.output.find("verdict: the twins agree"), std::string::npos);
}

// A user's training arguments with a validation split: the check says it leaves the validation
// loss out (it used to accept the evaluation options silently), and says nothing without one.
TEST(CheckCommand, ItSaysTheValidationLossIsNotCompared) {
  const auto with_split = testing::run_tandem(tiny_check({"--updates", "1", "--split", "80,20,0", "--eval-iters", "2"}), "", "2>&1");
  EXPECT_EQ(with_split.exit_code, 0) << with_split.output;
  EXPECT_NE(with_split.output.find("not compared: the validation loss (--eval-iters 2"), std::string::npos)
      << with_split.output;
  const auto without = testing::run_tandem(tiny_check({"--updates", "1"}), "", "2>&1");
  EXPECT_EQ(without.output.find("not compared"), std::string::npos) << without.output;
}

// The statistical bounds' rounding probe takes 160 bytes a value: a model it cannot hold (here
// about 2 TiB of probes) is refused before anything allocates, naming the need, what there is and
// the way out (--rigorous-bounds); it used to allocate until the kernel killed it.
TEST(CheckCommand, AModelTheRoundingProbeCannotHoldIsRefusedBeforeItAllocates) {
  const std::vector<std::string> huge = {
      "check", "--train-samples", "16", "--num-layers", "32", "--hidden-size", "4096",
      "--num-attention-heads", "32", "--seq-length", "4096", "--global-batch-size", "4",
      "--micro-batch-size", "2", "--data-cache",
      (std::filesystem::path(::testing::TempDir()) / "tandem-check-corpus").string()};
  const auto result = testing::run_tandem(huge, "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  for (const char* words : {"--hidden-size = 4096", "rounding probe needs", "GiB available", "--rigorous-bounds"}) {
    EXPECT_NE(result.output.find(words), std::string::npos) << words << "\n" << result.output;
  }
}

TEST(CheckCommand, TheDoubleReferenceIsHeldAgainstFiftyDigits) {
  const auto result =
      testing::run_tandem(tiny_check({"--updates", "1", "--fast-twin", "reference-double"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("reference<double>, DP 1 x 2 microbatches x mbs 2 [fast twin] vs "
                               "reference<float50>"),
            std::string::npos)
      << result.output;
}

TEST(CheckCommand, TheExitStatusIsTheVerdictAWrongTwinFails) {
  // Negative control: weight decay on the norm weights must be reported and fail the command.
  const auto result = testing::run_tandem(
      tiny_check({"--updates", "1", "--test-mutant", "decay_norm_weights"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("FAIL update 1 params model.layers.0.input_layernorm.weight"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("verdict: the twins DISAGREE"), std::string::npos);
}

TEST(CheckCommand, TheSemanticBuildAgreesWithTheReferenceAtFp64Bounds) {
  const auto result = testing::run_tandem(
      tiny_check({"--updates", "2", "--fast-twin", "production-semantic"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("production<cpu, fp64 semantic>"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("verdict: the twins agree"), std::string::npos);
}

TEST(CheckCommand, TheSemanticBuildCatchesABugOfAPartInAMillion) {
  // Negative control: AdamW adding eps * sqrt(1 - b2^t) instead of eps moves each update by about
  // 1e-5 of itself, under fp32's bounds; the semantic build's fp64 bounds must reject it.
  const auto result = testing::run_tandem(
      tiny_check({"--updates", "1", "--test-mutant", "adam_epsilon_scaled_by_bias_correction"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("FAIL update 1 params"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("verdict: the twins DISAGREE"), std::string::npos);
}

TEST(CheckCommand, TheSemanticBuildRefusesCuda) {
  const auto result = testing::run_tandem(
      tiny_check({"--updates", "1", "--fast-twin", "production-semantic", "--device", "cuda"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("fix: drop --device cuda"), std::string::npos) << result.output;
}

TEST(CheckCommand, ProductionRanksOnThreadsAgreeWithTheReferencesEmulatedReplicas) {
  const auto result = testing::run_tandem(
      tiny_check({"--updates", "2", "--data-parallel-size", "2", "--use-distributed-optimizer"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("DP 2 x 1 microbatches x mbs 2, 2 ranks on threads, distributed optimizer"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("verdict: the twins agree"), std::string::npos);
}

TEST(CheckCommand, ALayoutTheProductionTwinCannotRunIsBadInput) {
  // Ranks on one device would need NCCL across processes: cuda runs one rank per process.
  const auto result = testing::run_tandem(
      tiny_check({"--data-parallel-size", "2", "--device", "cuda"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("mpirun -np 2"), std::string::npos) << result.output;
}

TEST(CheckCommand, UnderMpirunEachProcessIsOneProductionRankAndRankZeroReports) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto result = testing::run_tandem(tiny_check({"--updates", "2"}), mpirun, "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("rank of 2 MPI ranks"), std::string::npos) << result.output;
  const auto verdict = result.output.find("verdict: the twins agree");
  EXPECT_NE(verdict, std::string::npos) << result.output;
  EXPECT_EQ(verdict, result.output.rfind("verdict:")) << "one report, from rank 0:\n" << result.output;
  // Only the production twin runs as ranks.
  const auto reference = testing::run_tandem(tiny_check({"--fast-twin", "reference-double"}), mpirun, "2>&1");
  EXPECT_EQ(reference.exit_code, 2) << reference.output;
}

// --load: both twins start from a checkpoint (a production one here, one written by 2 MPI ranks
// as shards too); the updates continue its numbering. --save is refused: check writes nothing.
TEST(CheckCommand, LoadStartsBothTwinsFromACheckpointAndSaveIsRefused) {
  const testing::ScratchDirectory scratch("tandem-check-load");
  auto train = [&](const std::filesystem::path& save, const std::string& prefix) {
    std::vector<std::string> arguments = tiny_check({"--engine", "production", "--device", "cpu", "--save",
                                                     save.string(), "--exit-interval", "2", "--quiet"});
    arguments.front() = "train";
    return testing::run_tandem(arguments, prefix, "2>&1");
  };
  const auto one = scratch.path() / "one";
  const auto trained = train(one, "");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto result = testing::run_tandem(tiny_check({"--updates", "2", "--load", one.string()}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("start: the state of " + one.string() + " (production engine, F32) at iteration 2"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("update 0 (initialization"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("-- update 3: ok"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("-- update 4: ok"), std::string::npos) << result.output;

  // A changed model is refused as a resume would be (exit 2, naming the setting).
  const auto changed =
      testing::run_tandem(tiny_check({"--load", one.string(), "--hidden-size", "16"}), "", "2>&1");
  EXPECT_EQ(changed.exit_code, 2) << changed.output;
  EXPECT_NE(changed.output.find("--hidden-size"), std::string::npos) << changed.output;
  // A wrong twin started from the checkpoint still fails (the verdict is the exit status).
  const auto mutant = testing::run_tandem(
      tiny_check({"--updates", "1", "--load", one.string(), "--test-mutant", "decay_norm_weights"}), "", "2>&1");
  EXPECT_EQ(mutant.exit_code, 1) << mutant.output;

  const std::string mpirun = testing::mpirun_prefix(2);
  if (!mpirun.empty()) {
    const auto two = scratch.path() / "two";
    std::vector<std::string> arguments = tiny_check({"--engine", "production", "--device", "cpu", "--save",
                                                     two.string(), "--exit-interval", "2", "--quiet",
                                                     "--data-parallel-size", "2"});
    arguments.front() = "train";
    const auto sharded = testing::run_tandem(arguments, mpirun, "2>&1");
    ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
    const auto from_shards = testing::run_tandem(tiny_check({"--updates", "1", "--load", two.string()}), "", "2>&1");
    EXPECT_EQ(from_shards.exit_code, 0) << from_shards.output;
    EXPECT_NE(from_shards.output.find("-- update 3: ok"), std::string::npos) << from_shards.output;
  }

  const auto saving = testing::run_tandem(tiny_check({"--save", (scratch.path() / "x").string()}), "", "2>&1");
  EXPECT_EQ(saving.exit_code, 2) << saving.output;
  EXPECT_NE(saving.output.find("tandem check writes no checkpoint"), std::string::npos) << saving.output;
}

}  // namespace
}  // namespace tandem
