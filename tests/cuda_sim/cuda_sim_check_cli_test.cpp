// `tandem check --device cuda-sim` (docs/CUDA-SIM.md "tandem check on cuda-sim"): the production
// trainer's cuda build, with the shipped CUDA sources run on the CPU, held to the double reference
// by the real binary on every layout family, ranks on threads: DP 2, TP 2 + SP, PP 2 and
// TP 2 + SP x PP 2 x DP 2 (8 ranks; with the distributed optimizer and both overlaps, so the cuda
// backend's second stream takes part), fp32 and bf16 (attention on the emulated tensor cores), for
// 2 updates each, a device a rank over cuda-sim's NCCL (and once all on one device, staged through
// host memory). A bug planted in the cuda build must fail the same check.
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <tuple>
#include <string>
#include <vector>

#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

// A small run on the embedded corpus: 2 layers (one a stage under PP 2), 4 heads (2 a rank under
// TP 2), head_dim 16 (the tensor-core kernel's smallest), 4 microbatches of 2 in a batch.
std::vector<std::string> sim_check(const std::vector<std::string>& extra) {
  std::vector<std::string> arguments = {
      "check", "--device", "cuda-sim", "--updates", "2", "--train-samples", "16", "--num-layers", "2",
      "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128", "--seq-length", "32",
      "--global-batch-size", "8", "--micro-batch-size", "2", "--clip-grad", "0.5", "--attention-dropout", "0.0",
      "--hidden-dropout", "0.0",
      "--data-cache", (std::filesystem::path(::testing::TempDir()) / "tandem-cuda-sim-check-corpus").string()};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  return arguments;
}

struct Layout {
  std::string name;
  std::vector<std::string> arguments;
  std::string description;  // what the report's first line says of the fast twin's ranks
};

// gtest names the case by its name, not its bytes.
void PrintTo(const Layout& layout, std::ostream* out) { *out << layout.name; }

class CudaSimCheck : public ::testing::TestWithParam<std::tuple<Layout, bool>> {};

TEST_P(CudaSimCheck, TheCudaBuildOnCudaSimAgreesWithTheReferenceForTwoUpdates) {
  const auto& [layout, bf16] = GetParam();
  std::vector<std::string> extra = layout.arguments;
  if (bf16) extra.push_back("--bf16");
  const auto result = testing::run_tandem(sim_check(extra), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const std::string twin = std::string("production<cuda-sim, ") + (bf16 ? "bf16" : "fp32") + ">";
  EXPECT_NE(result.output.find(twin), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(layout.description), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("-- update 2: ok"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("verdict: the twins agree within every bound"), std::string::npos) << result.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CudaSimCheck,
    ::testing::Combine(
        ::testing::Values(
            Layout{"dp2", {"--data-parallel-size", "2"}, "2 ranks on threads, a device each, NCCL"},
            Layout{"tp2_sp", {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "2 ranks on threads (TP 2 x DP 1), a device each, NCCL"},
            Layout{"pp2", {"--pipeline-model-parallel-size", "2"}, "2 ranks on threads (TP 1 x PP 2 x DP 1), a device each, NCCL"},
            Layout{"tp2_sp_pp2_dp2",
                   {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
                    "--data-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce",
                    "--overlap-param-gather"},
                   "8 ranks on threads (TP 2 x PP 2 x DP 2), a device each, NCCL, distributed optimizer, overlapped gradient reduce"}),
        ::testing::Bool()),
    [](const auto& info) {
      return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_bf16" : "_fp32");
    });

TEST(CudaSimCheckNegative, ARowParallelSumLeftOutOfTheCudaBuildFailsTheCheck) {
  const auto result = testing::run_tandem(
      sim_check({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--test-mutant", "row_parallel_not_summed"}),
      "", "2>&1");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("production<cuda-sim, fp32>"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("FAIL update 1 loss"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("verdict: the twins DISAGREE"), std::string::npos) << result.output;
}

// Fewer devices than ranks: every rank on device 0, its exchanges staged through host memory (as on
// a machine with one GPU), and the same verdict.
TEST(CudaSimCheckStaged, RanksSharingOneDeviceExchangeThroughHostMemoryAndAgree) {
  const auto result = testing::run_tandem(
      sim_check({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2"}),
      "TANDEM_CUDA_SIM_DEVICES=1 ", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("4 ranks on threads (TP 2 x PP 2 x DP 1)"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("NCCL"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("verdict: the twins agree within every bound"), std::string::npos) << result.output;
}

TEST(CudaSimCheckNegative, WhatCudaSimCannotRunIsBadInput) {
  auto result = testing::run_tandem(sim_check({"--fast-twin", "production-semantic"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("fix: drop --device cuda-sim"), std::string::npos) << result.output;
  // A reference-side mutant has no switch in the production trainer's cuda build.
  result = testing::run_tandem(sim_check({"--test-mutant", "eps_inside_sqrt"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--test-mutant eps_inside_sqrt on cuda-sim"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem
