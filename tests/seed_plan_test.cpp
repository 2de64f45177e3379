// The golden test of SPEC 11: the real `tandem plan --json` on the seed's Megatron fragment (as
// written, SPEC 10) plus the 500B architecture on 5,120 GPUs must reproduce every number of the
// seed, in samples and again with the budget given as --train-tokens 10T --lr-warmup-tokens 20B.
// Expected values are written here as their derivations and checked against
// fixtures/seed/expected_plan.json, so neither the fixture nor the planner can drift alone.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

const std::string kSeedDirectory = std::string(TANDEM_SOURCE_DIR) + "/fixtures/seed/";
constexpr double kEpsilon = std::numeric_limits<double>::epsilon();

// The whitespace-separated words of a fixture file, as a shell's $(cat FILE) would pass them.
std::vector<std::string> words_of(const std::string& file, const std::vector<std::string>& drop = {}) {
  std::ifstream in(kSeedDirectory + file);
  EXPECT_TRUE(in) << "cannot read " << kSeedDirectory + file;
  std::vector<std::string> words;
  for (std::string line; std::getline(in, line);) {
    bool dropped = false;
    for (const auto& prefix : drop) dropped = dropped || line.rfind(prefix, 0) == 0;
    if (dropped) continue;
    std::istringstream line_words(line);
    for (std::string word; line_words >> word;) words.push_back(word);
  }
  return words;
}

nlohmann::json expected_fixture() {
  std::ifstream in(kSeedDirectory + "expected_plan.json");
  return nlohmann::json::parse(in);
}

std::vector<std::string> plan_arguments(bool budget_in_tokens) {
  std::vector<std::string> arguments = {"plan", "--json", "--world-size", "5120"};
  // The token run drops the fragment's two sample spans the token options replace
  // (build_run_config refuses a length given twice); --lr-decay-samples stays as written.
  const std::vector<std::string> drop =
      budget_in_tokens ? std::vector<std::string>{"--train-samples", "--lr-warmup-samples"}
                       : std::vector<std::string>{};
  for (const auto& word : words_of("megatron_args.txt", drop)) arguments.push_back(word);
  for (const auto& word : words_of("architecture_500b.txt")) arguments.push_back(word);
  if (budget_in_tokens) {
    for (const char* word : {"--train-tokens", "10T", "--lr-warmup-tokens", "20B"}) {
      arguments.push_back(word);
    }
  }
  return arguments;
}

nlohmann::json run_plan(bool budget_in_tokens) {
  const auto result = testing::run_tandem(plan_arguments(budget_in_tokens), "", "2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return nlohmann::json::parse(result.output);
}

TEST(SeedFixture, FragmentIsTheSeedsTwentyFiveLines) {
  // SPEC 10: the seed's fragment parses as written; the fixture holds it verbatim.
  std::ifstream in(kSeedDirectory + "megatron_args.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 25u);
  EXPECT_EQ(lines.front(), "--tensor-model-parallel-size 8");
  EXPECT_EQ(lines.back(), "--lr-decay-samples 1220701440");
}

TEST(SeedFixture, ExpectedNumbersAreTheirDerivations) {
  const nlohmann::json expected = expected_fixture().at("expected");
  const std::int64_t sequences = 1 * 24 * 80;             // mbs x microbatches x DP
  const std::int64_t tokens_per_update = sequences * 8192;  // x seq_length
  EXPECT_EQ(expected.at("world_size"), 8 * 8 * 1 * 80);     // TP x PP x CP x DP
  EXPECT_EQ(expected.at("sequences_per_update"), sequences);
  EXPECT_EQ(expected.at("tokens_per_update"), tokens_per_update);
  // Warmup: ceil(20e9 / 15,728,640) = 1,272 updates (1,271 x 15,728,640 < 20e9).
  EXPECT_LT(1271 * tokens_per_update, 20'000'000'000);
  EXPECT_GE(1272 * tokens_per_update, 20'000'000'000);
  EXPECT_EQ(expected.at("warmup_updates"), 1272);
  EXPECT_EQ(expected.at("warmup_samples"), 1272 * sequences);
  EXPECT_EQ(expected.at("warmup_tokens"), 1272 * tokens_per_update);
  // Budget: floor(10e12 / 15,728,640) = 635,782 updates.
  EXPECT_LE(635782 * tokens_per_update, 10'000'000'000'000);
  EXPECT_GT(635783 * tokens_per_update, 10'000'000'000'000);
  EXPECT_EQ(expected.at("total_updates"), 635782);
  EXPECT_EQ(expected.at("total_samples"), 635782 * sequences);
  EXPECT_EQ(expected.at("total_tokens"), 635782 * tokens_per_update);
  EXPECT_EQ(expected.at("budget_shortfall_tokens_when_given_in_tokens"),
            10'000'000'000'000 - 635782 * tokens_per_update);
  EXPECT_EQ(expected.at("warmup_excess_tokens_when_given_in_tokens"),
            1272 * tokens_per_update - 20'000'000'000);
  EXPECT_EQ(expected.at("attention_pairs")[0].at("causal_pairs"), 4096 * 4097 / 2);
  EXPECT_EQ(expected.at("attention_pairs")[1].at("causal_pairs"), 8192 * 8193 / 2);
  // The 500B architecture (fixtures/seed/README.md): L 112, d 18,432, F 65,536, G 16 x hd 128,
  // vocabulary 128,256 padded to a multiple of 128 x TP 8 = 129,024.
  const std::int64_t d = 18432, ffn = 65536, kv = 16 * 128, vocab = 129024, layers = 112;
  const std::int64_t per_layer = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d;
  EXPECT_EQ(expected.at("parameters_total"), vocab * d + layers * per_layer + d + vocab * d);
}

// The seed's --overlap-grad-reduce at DP 80: Megatron's default bucket, max(40M, 1M x 80) = 80M
// parameters, rounded up by the production trainer's rule to a multiple of DP x 1,024 = 81,920:
// 977 x 81,920 = 80,035,840; the first stage's 7,960,780,800 parameters per GPU (the planner's own
// count, checked by SeedPlan) fill 99 such buckets and a 100th of 37,232,640 padded to 455 units.
// Each rank sends 79/80 of the padded buffer in fp32 for the reduce-scatter and in bf16 for the
// distributed optimizer's weight all-gather.
TEST(SeedPlan, DataParallelExchangeIsItsDerivation) {
  const nlohmann::json plan = run_plan(false);
  const nlohmann::json& first = plan.at("memory_per_gpu").at("stages").at(0);
  ASSERT_EQ(first.at("stage"), "first");
  ASSERT_EQ(first.at("parameters_per_gpu"), 7'960'780'800);
  const nlohmann::json& exchange = first.at("dp_exchange");
  EXPECT_EQ(exchange.at("buckets"), 100);
  EXPECT_EQ(exchange.at("bucket_parameters"), 977 * 81920);
  EXPECT_EQ(exchange.at("slice_parameters"), 977 * 1024);
  const double padded = 99.0 * 977 * 81920 + 455.0 * 81920;
  const double sent = 79.0 / 80.0 * padded;
  EXPECT_NEAR(exchange.at("reduce_scatter_gib_sent_per_update").get<double>(), sent * 4 / 1073741824.0, 1e-9);
  EXPECT_NEAR(exchange.at("all_gather_gib_sent_per_update").get<double>(), sent * 2 / 1073741824.0, 1e-9);
}

// Every SPEC 11 number, from one `tandem plan --json` run.
void expect_seed_numbers(const nlohmann::json& plan, const nlohmann::json& expected) {
  // Exact (integers).
  for (const char* key :
       {"world_size", "data_parallel_size", "layout", "sequences_per_update", "tokens_per_update",
        "microbatches_per_replica", "warmup_updates", "warmup_samples", "warmup_tokens",
        "total_updates", "total_samples", "total_tokens", "train_samples_remainder",
        "lr_decay_style"}) {
    EXPECT_EQ(plan.at(key), expected.at(key)) << key;
  }
  EXPECT_EQ(plan.at("parameters").at("total"), expected.at("parameters_total"));
  EXPECT_EQ(plan.at("attention_pairs_by_seq_length"), expected.at("attention_pairs"));

  // Bubbles: exact, because the planner does the same IEEE division (p-1)/(m+p-1); then the
  // percent to one decimal as the seed prints it.
  const auto& bubbles = plan.at("pipeline_bubble_alternatives");
  const auto& expected_bubbles = expected.at("pipeline_bubble");
  ASSERT_EQ(bubbles.size(), expected_bubbles.size());
  for (std::size_t i = 0; i < bubbles.size(); ++i) {
    const auto& want = expected_bubbles[i];
    EXPECT_EQ(bubbles[i].at("microbatches_per_replica"), want.at("microbatches_per_replica"));
    const double fraction = want.at("numerator").get<double>() / want.at("denominator").get<double>();
    EXPECT_EQ(bubbles[i].at("bubble_fraction").get<double>(), fraction) << "m index " << i;
    EXPECT_EQ(std::round(1000.0 * fraction) / 10.0, want.at("percent_one_decimal").get<double>());
  }
  EXPECT_EQ(plan.at("pipeline_bubble_fraction").get<double>(), 7.0 / 31.0);  // m = 24

  // lr halfway through the decay span (SPEC 11: 4.4e-5). Approximate: cos(pi/2) = 6.1e-17 in
  // double falls below half an ulp of 1, so coeff is exactly 0.5; min + 0.5 x (max - min) and
  // 0.5 x (max + min) then differ by at most three roundings of values <= 8e-5: 2 eps x 8e-5.
  const double midpoint_lr = 0.5 * (8e-5 + 8e-6);
  const double lr_bound = 2.0 * kEpsilon * 8e-5;
  EXPECT_NEAR(plan.at("lr_at_decay_midpoint").get<double>(), midpoint_lr, lr_bound);
  EXPECT_EQ(plan.at("decay_midpoint_samples"), 2442240 + (1220701440 - 2442240) / 2);
  for (const auto& point : plan.at("lr_milestones")) {
    const std::string name = point.at("name");
    if (name == "first_update") {
      EXPECT_EQ(point.at("update"), 1);
      EXPECT_EQ(point.at("lr").get<double>(), 0.0);  // exact: --lr-warmup-init 0 (SPEC 8)
    } else if (name == "end_of_warmup") {
      EXPECT_EQ(point.at("update"), 1272 + 1);
      EXPECT_EQ(point.at("scheduler_samples"), 1272 * 1920);
      EXPECT_NEAR(point.at("lr").get<double>(), 8e-5, lr_bound);
    } else if (name == "decay_midpoint") {
      // 611,571,840 = 318,527 x 1,920 samples: update 318,528 starts exactly there.
      EXPECT_EQ(point.at("update"), 318527 + 1);
      EXPECT_EQ(point.at("scheduler_samples"), 318527 * 1920);
      EXPECT_NEAR(point.at("lr").get<double>(), midpoint_lr, lr_bound);
    } else if (name == "last_update") {
      EXPECT_EQ(point.at("update"), 635782);
      // cos(pi x (D - GBS - W)/(D - W)) is near -1; the lr sits within one step of min:
      // (max - min) x (1 - cos(pi / 634,510)) / 2 < 1e-15.
      EXPECT_NEAR(point.at("lr").get<double>(), 8e-6, 1e-15);
    }
  }
  // Decay multiplier at the peak (SPEC 7, 11): exact, the planner computes the same two IEEE
  // operations 1 - lr x wd with wd = 0.1 unchanged by the constant style; printed as 0.999992.
  EXPECT_EQ(plan.at("decay_multiplier_at_peak").get<double>(), 1.0 - 8e-5 * 0.1);
  EXPECT_NEAR(plan.at("decay_multiplier_at_peak").get<double>(),
              expected.at("decay_multiplier_at_peak").at("value").get<double>(), kEpsilon);
}

TEST(SeedPlan, FragmentAsWrittenReproducesEverySpec11Number) {
  const nlohmann::json expected = expected_fixture().at("expected");
  const nlohmann::json plan = run_plan(/*budget_in_tokens=*/false);
  expect_seed_numbers(plan, expected);
  // Given in samples: no token rounding to report.
  EXPECT_TRUE(plan.at("budget_shortfall_tokens").is_null());
  EXPECT_TRUE(plan.at("warmup_excess_tokens").is_null());
}

TEST(SeedPlan, TokenBudgetRoundsToTheSameRunAndReportsTheShortfall) {
  const nlohmann::json expected = expected_fixture().at("expected");
  const nlohmann::json plan = run_plan(/*budget_in_tokens=*/true);
  expect_seed_numbers(plan, expected);
  // SPEC 11: 13,803,520 tokens short of 10T; the warmup 6,830,080 over 20B.
  EXPECT_EQ(plan.at("budget_shortfall_tokens"),
            expected.at("budget_shortfall_tokens_when_given_in_tokens"));
  EXPECT_EQ(plan.at("warmup_excess_tokens"),
            expected.at("warmup_excess_tokens_when_given_in_tokens"));
  // The samples run and the tokens run describe the same run; only the rounding report differs.
  nlohmann::json samples_plan = run_plan(false);
  nlohmann::json tokens_plan = plan;
  for (auto* document : {&samples_plan, &tokens_plan}) {
    for (const char* key : {"budget_shortfall_tokens", "warmup_excess_tokens",
                            "requested_train_tokens", "requested_warmup_tokens", "config"}) {
      document->erase(key);
    }
  }
  EXPECT_EQ(samples_plan, tokens_plan);
}

// issue 12: "tandem plan on the seed says which recomputation setting fits 80 GiB per GPU". Without
// recomputation the first stage does not fit; the plan names the block recomputation with the
// fewest layers that fits, by its own count, and holds to it: that setting plans no memory
// warning, one layer fewer does.
TEST(SeedPlan, ThePlanNamesTheLeastRecomputationThatFitsEightyGib) {
  const auto plan_with = [](const std::vector<std::string>& extra) {
    std::vector<std::string> arguments = plan_arguments(false);
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    const auto result = testing::run_tandem(arguments, "", "2>/dev/null");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return nlohmann::json::parse(result.output);
  };
  const auto memory_warning = [](const nlohmann::json& plan) -> std::string {
    for (const auto& warning : plan.at("warnings")) {
      if (warning.get<std::string>().rfind("memory", 0) == 0) return warning.get<std::string>();
    }
    return "";
  };
  const std::string advice = memory_warning(plan_with({}));
  const std::string prefix = "--recompute-method block --recompute-num-layers ";
  const auto at = advice.find(prefix);
  ASSERT_NE(at, std::string::npos) << advice;
  const int layers = std::stoi(advice.substr(at + prefix.size()));
  ASSERT_GT(layers, 1) << advice;
  const auto block = [](int n) {
    return std::vector<std::string>{"--recompute-granularity", "full", "--recompute-method", "block",
                                    "--recompute-num-layers", std::to_string(n)};
  };
  const nlohmann::json fits = plan_with(block(layers));
  EXPECT_EQ(memory_warning(fits), "");
  EXPECT_LE(fits.at("memory_per_gpu").at("peak_gib").get<double>(), 80.0);
  EXPECT_NE(memory_warning(plan_with(block(layers - 1))), "");
}

TEST(SeedPlan, TableShowsTheSeedsFigures) {
  std::vector<std::string> arguments = plan_arguments(true);
  arguments.erase(arguments.begin() + 1);  // drop --json: the readable table
  const auto result = testing::run_tandem(arguments, "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* figure : {"1,920", "15,728,640", "36.8 %", "22.6 %", "12.7 %", "8,390,656",
                             "33,558,528", "1,272", "2,442,240", "20,006,830,080", "635,782",
                             "1,220,701,440", "9,999,986,196,480", "13,803,520",
                             "TP8 x PP8 x CP1 x DP80 = 5,120 GPUs", "4.4e-05", "0.999992"}) {
    EXPECT_NE(result.output.find(figure), std::string::npos) << figure;
  }
}

// The fragment alone, as a user pastes it (no architecture): `tandem schedule` reads no
// architecture, so the default H = 4 is not held to TP 8 (it refused the fragment on a default the
// user never wrote); `tandem plan` needs the architecture and says that the value is a default.
TEST(SeedPlan, TheFragmentAloneSchedulesAndThePlanNamesTheDefaultItNeeds) {
  std::vector<std::string> schedule = {"schedule", "--csv", "--every", "100000"};
  for (const auto& word : words_of("megatron_args.txt", {})) schedule.push_back(word);
  const auto scheduled = testing::run_tandem(schedule, "", "2>/dev/null");
  ASSERT_EQ(scheduled.exit_code, 0) << scheduled.output;
  EXPECT_EQ(scheduled.output.rfind("update,consumed_samples,lr,wd", 0), 0u) << scheduled.output;
  std::vector<std::string> plan = {"plan", "--world-size", "5120"};
  for (const auto& word : words_of("megatron_args.txt", {})) plan.push_back(word);
  const auto planned = testing::run_tandem(plan, "", "2>&1");
  EXPECT_EQ(planned.exit_code, 2) << planned.output;
  EXPECT_NE(planned.output.find("--num-attention-heads = 4 (the default: not given): must be divisible by "
                                "--tensor-model-parallel-size (8)"),
            std::string::npos)
      << planned.output;
}

// `tandem plan --rank R`: where GPU 4,097 of the seed's 5,120 sits (core/rank_grid.hpp holds the
// grid itself to Megatron's order exhaustively; this is the command line's face of it).
TEST(SeedPlan, RankShowsWhereGpuFourThousandNinetySevenSitsAndItsGroups) {
  std::vector<std::string> arguments = plan_arguments(false);
  arguments.erase(arguments.begin() + 1);  // drop --json
  arguments.insert(arguments.end(), {"--rank", "4097"});
  const auto table = testing::run_tandem(arguments, "", "2>&1");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  // 4097 = 1 + 8 x (32 + 80 x 6): TP fastest, then CP, DP, PP.
  for (const char* line : {"Rank 4097 of TP 8 x CP 1 x DP 80 x PP 8 = 5,120 ranks",
                           "coordinates: tensor 1, context 0, data 32, pipeline stage 6",
                           "holds: layers 84-97\n",  // 112 layers, 14 a stage
                           "tensor group 512 of 640, member 1: 4,096-4,103: 8 ranks",
                           "embedding group: none"}) {
    EXPECT_NE(table.output.find(line), std::string::npos) << line << "\n" << table.output;
  }
  arguments.push_back("--json");
  const auto json = testing::run_tandem(arguments, "", "2>/dev/null");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto rank = nlohmann::json::parse(json.output)["rank"];
  EXPECT_EQ(rank["coordinates"]["pipeline"], 6);
  EXPECT_EQ(rank["model_chunks"][0]["first_layer"], 6 * 14);
  EXPECT_EQ(rank["model_chunks"][0]["layers"], 14);
  EXPECT_EQ(rank["groups"]["data"]["members"].size(), 80u);
  EXPECT_EQ(rank["groups"]["pipeline"]["members"][7], 1 + 8 * 32 + 640 * 7);
  arguments.back() = "--rank";
  arguments.push_back("5120");
  const auto outside = testing::run_tandem(arguments, "", "2>&1");
  EXPECT_EQ(outside.exit_code, 2) << outside.output;
  EXPECT_NE(outside.output.find("--rank"), std::string::npos) << outside.output;
}

}  // namespace
}  // namespace tandem
