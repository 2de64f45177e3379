// The fixture of the `tandem train` command-line tests: a temporary folder of the test's own
// (removed afterwards) and the tiny run on the embedded corpus — 2 layers, width 32, 4 heads in
// 2 groups, 6 updates of 4 samples x 32 tokens, warmup + cosine, clipping at 1.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"

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

  // SPEC 9 through the binary: `arguments(extra)` builds a run's command line, started through
  // `launcher` (empty: one process; testing::mpirun_prefix(N): N ranks). The run goes straight to
  // iteration `last` into ROOT/NAME-straight, and into ROOT/NAME-resumed it stops at `stop`
  // (--exit-interval) and resumes with --load; the final checkpoints must hold the same tensor
  // files, byte for byte, and the same counters. Returns the resumed save directory.
  std::filesystem::path expect_resume_equals_straight(
      const std::string& name, const std::function<std::vector<std::string>(std::vector<std::string>)>& arguments,
      int stop, int last, const std::string& launcher = "") const {
    const auto straight = root_ / (name + "-straight");
    const auto resumed = root_ / (name + "-resumed");
    const auto stop_text = std::to_string(stop);
    const auto whole = run_tandem(arguments({"--save", straight.string()}), launcher, "2>&1");
    EXPECT_EQ(whole.exit_code, 0) << name << ": " << whole.output;
    const auto first = run_tandem(arguments({"--save", resumed.string(), "--exit-interval", stop_text}), launcher, "2>&1");
    EXPECT_EQ(first.exit_code, 0) << name << ": " << first.output;
    EXPECT_EQ(checkpoint_iterations(resumed), std::vector<std::string>{iteration_name(stop)}) << name;
    const auto second =
        run_tandem(arguments({"--save", resumed.string(), "--load", resumed.string()}), launcher, "2>&1");
    EXPECT_EQ(second.exit_code, 0) << name << ": " << second.output;
    const auto final_name = iteration_name(last);
    EXPECT_EQ(tensor_files_of(straight / final_name), tensor_files_of(resumed / final_name)) << name;
    const auto counters = [&](const std::filesystem::path& dir) {
      return nlohmann::json::parse(bytes_of(dir / final_name / "manifest.json"))["counters"];
    };
    EXPECT_EQ(counters(straight), counters(resumed)) << name;
    return resumed;
  }

 private:
  static std::string iteration_name(int iteration) {
    std::string digits = std::to_string(iteration);
    return "iter_" + std::string(7 - digits.size(), '0') + digits;
  }
  static std::vector<std::string> checkpoint_iterations(const std::filesystem::path& save) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(save)) {
      if (entry.path().filename().string().starts_with("iter_")) names.push_back(entry.path().filename().string());
    }
    return names;
  }
};

}  // namespace tandem::testing
