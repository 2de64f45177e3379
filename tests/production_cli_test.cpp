// `tandem train --engine production --device cpu` end to end, through the built binary (SPEC 9,
// 12): the header and iteration records (throughput included), `tandem audit` on a production
// log, checkpoints in F32, bit-exact resume through --load, --bf16, the skip limit.
// Kind of comparison: exact (files, fields, exit codes) and deterministic (bytes of checkpoints).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::bytes_of;
using testing::read_log;
using testing::run_tandem;

class ProductionCli : public ::testing::Test {
 protected:
  fs::path root_;

  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("tandem_production_cli_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // The tiny model on the embedded corpus: 6 updates of 4 samples x 32 tokens, on the cpu backend.
  std::vector<std::string> tiny(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> arguments = {
        "train", "--engine", "production", "--device", "cpu", "--num-layers", "2", "--hidden-size", "32",
        "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-samples", "24", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-samples", "8",
        "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
        "--data-cache", (root_ / "data").string(), "--quiet"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    return arguments;
  }
};

TEST_F(ProductionCli, LogHeaderRecordsAndAuditOnCpu) {
  const auto save = root_ / "run";
  const auto result = run_tandem(tiny({"--save", save.string(), "--audit-params", "8"}), "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto records = read_log(save / "log.jsonl");
  ASSERT_EQ(records.size(), 1u + 6u);
  EXPECT_EQ(records[0]["engine"], "production");
  EXPECT_EQ(records[0]["device"], "cpu");
  EXPECT_EQ(records[0]["main_precision"], "fp32");
  EXPECT_EQ(records[0]["compute_precision"], "fp32");
  EXPECT_TRUE(records[0].contains("throughput"));
  for (std::size_t i = 1; i < records.size(); ++i) {
    for (const char* field : {"loss", "grad_norm", "lr", "tokens_per_second", "model_flops", "mfu", "audit"}) {
      EXPECT_TRUE(records[i].contains(field)) << field << " in record " << i;
    }
    EXPECT_TRUE(records[i]["mfu"].is_null()) << "the cpu backend has no peak";
    EXPECT_GT(records[i]["model_flops"].get<double>(), 0.0);
  }
  const auto state = checkpoint::load_checkpoint(save);
  EXPECT_EQ(state.engine, "production");
  EXPECT_EQ(state.precision, "F32");
  const auto audit = run_tandem({"audit", (save / "log.jsonl").string()}, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  EXPECT_NE(audit.output.find("main precision fp32"), std::string::npos) << audit.output;
}

TEST_F(ProductionCli, ResumeThroughTheBinaryIsBitExact) {
  for (const bool bf16 : {false, true}) {
    const std::vector<std::string> precision = bf16 ? std::vector<std::string>{"--bf16"} : std::vector<std::string>{};
    const auto straight = root_ / (bf16 ? "straight-bf16" : "straight");
    const auto resumed = root_ / (bf16 ? "resumed-bf16" : "resumed");
    auto arguments = tiny({"--save", straight.string()});
    arguments.insert(arguments.end(), precision.begin(), precision.end());
    ASSERT_EQ(run_tandem(arguments, "", "2>&1").exit_code, 0);
    arguments = tiny({"--save", resumed.string(), "--exit-interval", "2"});
    arguments.insert(arguments.end(), precision.begin(), precision.end());
    const auto first = run_tandem(arguments, "", "2>&1");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    ASSERT_TRUE(fs::exists(resumed / "iter_0000002"));
    ASSERT_FALSE(fs::exists(resumed / "iter_0000006"));
    arguments = tiny({"--save", resumed.string(), "--load", resumed.string()});
    arguments.insert(arguments.end(), precision.begin(), precision.end());
    const auto second = run_tandem(arguments, "", "2>&1");
    ASSERT_EQ(second.exit_code, 0) << second.output;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      EXPECT_EQ(bytes_of(straight / "iter_0000006" / file), bytes_of(resumed / "iter_0000006" / file))
          << file << (bf16 ? " (bf16)" : " (fp32)");
    }
  }
}

TEST_F(ProductionCli, SkipLimitStopsAfterACheckpoint) {
  const auto save = root_ / "skips";
  const auto result = run_tandem(tiny({"--save", save.string(), "--test-nonfinite-gradient-iterations", "2,3",
                                       "--max-consecutive-skips", "2"}),
                                 "", "2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("iteration 3"), std::string::npos) << result.output;
  EXPECT_TRUE(fs::exists(save / "iter_0000003"));
  const auto records = read_log(save / "log.jsonl");
  ASSERT_EQ(records.size(), 1u + 3u);
  EXPECT_FALSE(records[2]["update_successful"].get<bool>());
  EXPECT_EQ(records[3]["skipped_updates"], 2);
}

TEST_F(ProductionCli, ReferenceCheckpointIsRefusedNamingTheEngine) {
  const auto save = root_ / "reference";
  std::vector<std::string> arguments = tiny({"--save", save.string(), "--train-samples", "8"});
  arguments[2] = "reference";  // --engine reference
  ASSERT_EQ(run_tandem(arguments, "", "2>&1").exit_code, 0);
  const auto result = run_tandem(tiny({"--load", save.string()}), "", "2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("reference engine"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem
