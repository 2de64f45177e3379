// The fixture of the `tandem data build` tests with real tokenizers (tests/bpe_tokenizer_test.cpp,
// sentencepiece_tokenizer_test.cpp): a folder of the test's own holding docs.jsonl, removed
// afterwards, the build of it into ROOT/ds with the test's tokenizer options, and its refusal.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/run_tandem.hpp"

namespace tandem::testing {

class DataBuildTest : public ::testing::Test {
 protected:
  // The folder is tandem-NAME-PID-TEST; `documents` is docs.jsonl's whole text.
  DataBuildTest(std::string name, std::string documents) : name_(std::move(name)), documents_(std::move(documents)) {}

  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("tandem-" + name_ + "-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_);
    std::ofstream(root_ / "docs.jsonl") << documents_;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  CommandResult build(std::vector<std::string> options) {
    std::vector<std::string> arguments{"data", "build", "--input", (root_ / "docs.jsonl").string(), "--output-prefix",
                                       (root_ / "ds").string()};
    arguments.insert(arguments.end(), options.begin(), options.end());
    return run_tandem(arguments, "", "2>&1");
  }

  // The build with `options` is refused as bad input (exit 2), saying `says` and how to fix it.
  void expect_build_refused(const std::vector<std::string>& options, const std::string& says) {
    const auto result = build(options);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(says), std::string::npos) << "expected \"" << says << "\" in:\n" << result.output;
    EXPECT_NE(result.output.find("fix: "), std::string::npos) << result.output;
  }

  std::filesystem::path root_;

 private:
  std::string name_;
  std::string documents_;
};

}  // namespace tandem::testing
