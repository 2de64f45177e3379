// The train benchmark's cpu mode end to end (bench/cuda_production_bench.cpp `train --device cpu`):
// the real binary trains the production tests' tiny model for 2 warm-up and 2 timed iterations and
// prints the fields docs/PERFORMANCE.md and ci/gpu-check read. No timing is asserted: only that it
// runs, exits 0, reports what ran, and that every figure is a finite positive number.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model_layout.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace tandem {
namespace {

testing::CommandResult run_bench(const std::string& arguments) {
  return testing::run_shell(testing::shell_quoted(TANDEM_PRODUCTION_BENCH) + " train --device cpu " + arguments + " 2>&1");
}

int count_lines_containing(const std::string& output, const std::string& text) {
  std::istringstream lines(output);
  int count = 0;
  for (std::string line; std::getline(lines, line);) count += line.find(text) != std::string::npos ? 1 : 0;
  return count;
}

nlohmann::json summary_line(const std::string& output) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("train-json ", 0) == 0) return nlohmann::json::parse(line.substr(11));
  }
  return nullptr;
}

TEST(TrainBench, CpuModeTrainsTheTinyModelAndPrintsEveryFigure) {
  const testing::CommandResult result = run_bench("--iterations 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_lines_containing(result.output, "(warm-up)"), 2) << result.output;
  EXPECT_EQ(count_lines_containing(result.output, "(timed)"), 2) << result.output;
  EXPECT_EQ(count_lines_containing(result.output, "median of 2 timed iterations"), 1) << result.output;

  const nlohmann::json summary = summary_line(result.output);
  ASSERT_TRUE(summary.is_object()) << "no train-json line in:\n" << result.output;
  EXPECT_EQ(summary["device"], "cpu");
  EXPECT_EQ(summary["timed_iterations"], 2);
  // What ran is the tests' tiny model, counted independently from its layout.
  EXPECT_EQ(summary["parameters"], make_model_layout(testing::tiny_production_model()).total_elements);
  EXPECT_EQ(summary["compute"], "fp32");
  for (const char* field : {"median_tokens_per_second", "median_model_flops_per_second",
                            "gemm_ceiling_flops_per_second", "median_ratio_to_gemm", "host_peak_resident_bytes"}) {
    ASSERT_TRUE(summary[field].is_number()) << field << " in " << summary.dump();
    const double value = summary[field].get<double>();
    EXPECT_TRUE(std::isfinite(value) && value > 0) << field << " = " << value;
  }
  // The cpu backend reports no peak (docs/PRODUCTION.md "Throughput"): no MFU is made up.
  EXPECT_TRUE(summary["median_mfu"].is_null()) << summary.dump();
}

// The options after the mode are `tandem train`'s, validated by the same code: a broken one is
// refused with exit 2 naming it, before anything runs (the check above can fail).
TEST(TrainBench, ABrokenTrainOptionIsRefusedBeforeAnythingRuns) {
  const testing::CommandResult result = run_bench("--iterations 2 --num-layers 0");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--num-layers"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("train-json"), std::string::npos) << result.output;
  EXPECT_EQ(testing::run_shell(testing::shell_quoted(TANDEM_PRODUCTION_BENCH) + " train --device tpu 2>&1").exit_code, 2);
  EXPECT_EQ(run_bench("--iterations two").exit_code, 2);
  EXPECT_EQ(run_bench("--iterations 0").exit_code, 2);
}

}  // namespace
}  // namespace tandem
