// `tandem train --data-order megatron` through the real binary (docs/DATA.md section 4): both
// engines train on exactly the windows `tandem data samples` prints (the windows that
// tests/megatron/ holds equal to megatron-core's GPTDataset), in that order; a stopped and resumed
// run equals a straight one bit for bit (SPEC 9).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

using testing::read_log;
using testing::run_tandem;

constexpr std::int64_t kEod = 256;          // the byte tokenizer's EOD (SPEC 12)
constexpr std::int64_t kGlobalBatch = 4;    // tiny_train_cli.hpp
constexpr std::int64_t kIterations = 6;     // 24 samples / 4

// Short documents of varied lengths, so EODs (inputs without loss, SPEC 3) vary from window to
// window and a window read from the wrong place changes an iteration's loss-token count.
class MegatronOrderCli : public testing::TinyTrainCli {
 protected:
  std::string prefix_;

  void SetUp() override {
    TinyTrainCli::SetUp();
    {
      std::ofstream docs(root_ / "docs.jsonl");
      for (int document = 0; document < 50; ++document) {
        docs << nlohmann::json{{"text", std::string(static_cast<std::size_t>(document * 7 % 29 + 1),
                                                    static_cast<char>('a' + document % 26))}}.dump()
             << "\n";
      }
    }
    prefix_ = (root_ / "docs_text_document").string();  // preprocess_data.py's name for key "text"
    const auto built = run_tandem({"data", "build", "--input", (root_ / "docs.jsonl").string(),
                                   "--output-prefix", (root_ / "docs").string()}, "", "2>&1");
    ASSERT_EQ(built.exit_code, 0) << built.output;
  }

  std::vector<std::string> run(const std::vector<std::string>& engine, std::vector<std::string> extra,
                               const std::string& order = "megatron") const {
    extra.insert(extra.end(), {"--data-path", prefix_, "--data-order", order});
    return tiny_train(engine, extra);
  }

  // Loss tokens of each iteration from the windows `tandem data samples` prints for `order`:
  // inputs (the first L of the L+1 tokens) that are not EOD.
  std::vector<std::int64_t> loss_tokens_per_iteration(const std::string& order) const {
    const auto printed = run_tandem({"data", "samples", "--data-path", prefix_, "--data-order", order,
                                     "--seq-length", "32", "--train-samples", "24", "--global-batch-size",
                                     "4", "--micro-batch-size", "2", "--count", "24"});
    EXPECT_EQ(printed.exit_code, 0);
    std::vector<std::int64_t> per_iteration(kIterations, 0);
    std::istringstream lines(printed.output);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::int64_t index = 0;
      words >> index;
      std::vector<std::int64_t> window;
      for (std::int64_t token = 0; words >> token;) window.push_back(token);
      EXPECT_EQ(window.size(), 33u) << line;
      for (std::size_t t = 0; t + 1 < window.size(); ++t) {
        per_iteration[static_cast<std::size_t>(index / kGlobalBatch)] += window[t] != kEod ? 1 : 0;
      }
    }
    return per_iteration;
  }
};

TEST_F(MegatronOrderCli, BothEnginesTrainOnTheWindowsDataSamplesPrints) {
  const auto expected = loss_tokens_per_iteration("megatron");
  for (const auto& engine : {std::vector<std::string>{"--engine", "reference"},
                             std::vector<std::string>{"--engine", "production", "--device", "cpu"}}) {
    const auto log = root_ / (engine[1] + ".jsonl");
    const auto result = run_tandem(run(engine, {"--log", log.string()}), "", "2>&1");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto records = read_log(log);
    ASSERT_EQ(records.size(), 1u + kIterations);
    EXPECT_EQ(records[0]["config"]["data"]["data_order"], "megatron");
    for (std::int64_t iteration = 1; iteration <= kIterations; ++iteration) {
      EXPECT_EQ(records[static_cast<std::size_t>(iteration)]["loss_tokens"],
                expected[static_cast<std::size_t>(iteration - 1)])
          << engine[1] << ", iteration " << iteration;
    }
  }
  // Negative control: tandem's own order reads other windows, and the counts show it.
  EXPECT_NE(loss_tokens_per_iteration("shuffled"), expected);
}

TEST_F(MegatronOrderCli, ResumeEqualsRunningStraightBitwise) {
  expect_resume_equals_straight(
      "megatron", [&](std::vector<std::string> extra) { return run({"--engine", "reference"}, extra); }, 3,
      kIterations);
}

}  // namespace
}  // namespace tandem
