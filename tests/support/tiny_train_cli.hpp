// The fixture of the `tandem train` command-line tests: a temporary folder of the test's own
// (removed afterwards) and the tiny run on the embedded corpus — 2 layers, width 32, 4 heads in
// 2 groups, 6 updates of 4 samples x 32 tokens, warmup + cosine, clipping at 1.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::testing {

class TinyTrainCli : public ::testing::Test {
 protected:
  std::filesystem::path root_;

  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("tandem_train_cli_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // `train ENGINE... MODEL... EXTRA...`; the engine's words come right after "train", so
  // arguments[2] is the engine's name.
  std::vector<std::string> tiny_train(const std::vector<std::string>& engine,
                                      const std::vector<std::string>& extra) const {
    std::vector<std::string> arguments = {"train"};
    arguments.insert(arguments.end(), engine.begin(), engine.end());
    const std::vector<std::string> model = {
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--group-query-attention", "--num-query-groups", "2", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--train-samples", "24",
        "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-samples", "8", "--lr-decay-style",
        "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1", "--data-cache",
        (root_ / "data").string(), "--quiet"};
    arguments.insert(arguments.end(), model.begin(), model.end());
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    return arguments;
  }
};

}  // namespace tandem::testing
