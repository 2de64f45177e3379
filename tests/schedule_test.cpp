// The shared lr/wd schedule (core/schedule.hpp, SPEC 8) as properties over generated schedules, in
// double and in 50 digits, the seed's milestones, and `tandem schedule`'s output contract
// (SPEC 12: CSV header, rows, JSON, --svg through gnuplot, written atomically).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <rapidcheck/gtest.h>

#include "core/args.hpp"
#include "tests/support/parse_run.hpp"
#include "core/schedule.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Wide = boost::multiprecision::cpp_bin_float_50;

constexpr double kEpsilon = std::numeric_limits<double>::epsilon();  // 2^-52
constexpr double kLrQuantum = 1.0 / (1 << 30);  // generated lrs are multiples of 2^-30 (dyadic)

// A schedule from the domain: dyadic lrs with 0 <= min <= max, 0 <= init <= max, warmup
// W >= min_warmup and decay span D - W >= min_decay_span, in samples (build_run_config enforces
// W <= D for decaying styles). Properties that need a warmup or a decay ask for one here rather
// than discarding cases.
ScheduleConfig draw_schedule(LrDecayStyle style, std::int64_t min_warmup = 0,
                             std::int64_t min_decay_span = 0) {
  ScheduleConfig schedule;
  const auto max_units = *rc::gen::inRange<std::int64_t>(1, std::int64_t{1} << 20);
  schedule.lr = static_cast<double>(max_units) * kLrQuantum;
  schedule.min_lr =
      static_cast<double>(*rc::gen::inRange<std::int64_t>(0, max_units + 1)) * kLrQuantum;
  schedule.lr_warmup_init =
      static_cast<double>(*rc::gen::inRange<std::int64_t>(0, max_units + 1)) * kLrQuantum;
  schedule.lr_decay_style = style;
  schedule.lr_warmup_samples = *rc::gen::inRange<std::int64_t>(min_warmup, 1'000'000);
  schedule.lr_decay_samples =
      schedule.lr_warmup_samples + *rc::gen::inRange<std::int64_t>(min_decay_span, 10'000'000);
  schedule.train_samples = schedule.lr_decay_samples;
  return schedule;
}

LrDecayStyle draw_decaying_style() {
  return *rc::gen::element(LrDecayStyle::linear, LrDecayStyle::cosine);
}

// The seed's schedule (SPEC 8, 11): warmup 2,442,240 samples, decay to 1,220,701,440, cosine.
ScheduleConfig seed_schedule() {
  ScheduleConfig schedule;
  schedule.lr = 8e-5;
  schedule.min_lr = 8e-6;
  schedule.lr_warmup_init = 0.0;
  schedule.lr_decay_style = LrDecayStyle::cosine;
  schedule.lr_warmup_samples = 1272 * 1920;
  schedule.lr_decay_samples = 635782 * 1920;
  schedule.train_samples = 635782 * 1920;
  schedule.weight_decay = 0.1;
  schedule.start_weight_decay = 0.1;
  schedule.end_weight_decay = 0.1;
  schedule.wd_incr_samples = schedule.train_samples;
  return schedule;
}

// ---- Learning rate (SPEC 8) ----

RC_GTEST_PROP(LearningRate, WarmupStartsAtInitAndNeverFalls, ()) {
  const ScheduleConfig schedule = draw_schedule(draw_decaying_style(), 1);
  // Exact: init + (max - init) * 0 / W is init.
  RC_ASSERT(learning_rate<double>(schedule, 0) == schedule.lr_warmup_init);
  const auto a = *rc::gen::inRange<std::int64_t>(0, schedule.lr_warmup_samples + 1);
  const auto b = *rc::gen::inRange<std::int64_t>(a, schedule.lr_warmup_samples + 1);
  // Exact: every operation is a correctly rounded, monotone function of n.
  RC_ASSERT(learning_rate<double>(schedule, a) <= learning_rate<double>(schedule, b));
}

RC_GTEST_PROP(LearningRate, ContinuousAtTheEndOfWarmup, ()) {
  const ScheduleConfig schedule = draw_schedule(draw_decaying_style(), 1, 1);
  const std::int64_t w = schedule.lr_warmup_samples;
  const std::int64_t d = schedule.lr_decay_samples;
  const double at_peak = learning_rate<double>(schedule, w);
  const double after = learning_rate<double>(schedule, w + 1);
  // Approximate: lr(W) = init + ((max - init) * W) / W carries three roundings, each at most
  // eps/2 relative to a value <= max; 2 eps x max bounds them.
  const double rounding = 2.0 * kEpsilon * schedule.lr;
  RC_ASSERT(std::abs(at_peak - schedule.lr) <= rounding);
  // One sample later the decay has moved at most one step: linear (max-min)/(D-W); cosine
  // (max-min)(1 - cos(pi/(D-W)))/2 <= (max-min)(pi^2/4)/(D-W) since D-W >= 1.
  const double step_bound = (std::numbers::pi * std::numbers::pi / 4.0) *
                            (schedule.lr - schedule.min_lr) / static_cast<double>(d - w);
  RC_ASSERT(std::abs(at_peak - after) <= step_bound + rounding);
}

RC_GTEST_PROP(LearningRate, NonIncreasingAfterWarmupAndBetweenMinAndMax, ()) {
  const ScheduleConfig schedule = draw_schedule(draw_decaying_style());
  const std::int64_t w = schedule.lr_warmup_samples;
  const std::int64_t d = schedule.lr_decay_samples;
  const auto a = *rc::gen::inRange<std::int64_t>(w + 1, d + 2);
  const auto b = *rc::gen::inRange<std::int64_t>(a, d + 3);
  const double lr_a = learning_rate<double>(schedule, a);
  const double lr_b = learning_rate<double>(schedule, b);
  // Exact: ratio, 1 - ratio and min + coeff x delta are monotone in n; cos is monotone on [0, pi]
  // and samples at least pi/(D-W) >= pi x 1e-7 apart differ far beyond libm's 1-ulp error.
  RC_ASSERT(lr_b <= lr_a);
  RC_ASSERT(lr_a >= schedule.min_lr);
  RC_ASSERT(lr_a <= schedule.lr);
}

RC_GTEST_PROP(LearningRate, EqualsMinAtAndAfterTheEndOfDecay, ()) {
  const ScheduleConfig schedule = draw_schedule(draw_decaying_style());
  const auto beyond = *rc::gen::inRange<std::int64_t>(1, 1'000'000'000);
  // Exact: n > D returns min itself (SPEC 8).
  RC_ASSERT(learning_rate<double>(schedule, schedule.lr_decay_samples + beyond) == schedule.min_lr);
  // Exact at n = D too: linear coeff 1 - 1 = 0; cosine coeff 0.5 x (cos(pi) + 1) = 0 because
  // cos of the double nearest pi rounds to -1.
  if (schedule.lr_decay_samples > schedule.lr_warmup_samples) {
    RC_ASSERT(learning_rate<double>(schedule, schedule.lr_decay_samples) == schedule.min_lr);
  }
}

RC_GTEST_PROP(LearningRate, ConstantStyleHoldsMaxForeverAfterWarmup, ()) {
  const ScheduleConfig schedule = draw_schedule(LrDecayStyle::constant);
  const auto n = *rc::gen::inRange<std::int64_t>(schedule.lr_warmup_samples + 1,
                                                 std::numeric_limits<std::int64_t>::max() / 2);
  RC_ASSERT(learning_rate<double>(schedule, n) == schedule.lr);  // exact: SPEC 8 "forever"
}

RC_GTEST_PROP(LearningRate, LinearMatchesTheSpecFormWithinRounding, ()) {
  const ScheduleConfig schedule = draw_schedule(LrDecayStyle::linear, 0, 1);
  const std::int64_t w = schedule.lr_warmup_samples;
  const std::int64_t d = schedule.lr_decay_samples;
  const auto n = *rc::gen::inRange<std::int64_t>(w + 1, d + 1);
  const double ratio = static_cast<double>(n - w) / static_cast<double>(d - w);
  // SPEC 8 writes linear as max - ratio x (max - min); Megatron (and we) min + (1 - ratio) x
  // (max - min). Approximate: the two orders differ by a few roundings of values <= max.
  const double spec_form = schedule.lr - ratio * (schedule.lr - schedule.min_lr);
  RC_ASSERT(std::abs(learning_rate<double>(schedule, n) - spec_form) <= 4.0 * kEpsilon * schedule.lr);
}

RC_GTEST_PROP(LearningRate, FiftyDigitsAgreeWithDouble, ()) {
  const ScheduleConfig schedule = draw_schedule(
      *rc::gen::element(LrDecayStyle::linear, LrDecayStyle::cosine, LrDecayStyle::constant));
  const auto n = *rc::gen::inRange<std::int64_t>(0, schedule.lr_decay_samples + 2);
  const double narrow = learning_rate<double>(schedule, n);
  const Wide wide = learning_rate<Wide>(schedule, n);
  // Approximate: double's result carries at most ~6 roundings (and cos's 1 ulp) of values <= max.
  RC_ASSERT(abs(Wide(narrow) - wide) <= Wide(8.0 * kEpsilon * schedule.lr));
}

TEST(LearningRate, FiftyDigitPiReachesTheExactMidpoint) {
  // In 50 digits cos(pi/2) is ~1e-50, so lr(W + (D-W)/2) = min + (max - min)/2 to ~1e-50
  // relative. Negative control: a double pi would leave cos(pi/2) = 6.1e-17 and miss by
  // ~3e-17 relative, far outside the 1e-45 bound.
  const ScheduleConfig schedule = seed_schedule();
  const std::int64_t midpoint = schedule.lr_warmup_samples +
                                (schedule.lr_decay_samples - schedule.lr_warmup_samples) / 2;
  const Wide expected = (Wide(schedule.lr) + Wide(schedule.min_lr)) / 2;
  const Wide got = learning_rate<Wide>(schedule, midpoint);
  EXPECT_LE(abs(got - expected) / expected, Wide("1e-45")) << "got " << got << " expected "
                                                            << expected;
}

TEST(LearningRate, SeedMilestones) {
  const ScheduleConfig schedule = seed_schedule();
  constexpr std::int64_t gbs = 1 * 24 * 80;  // SPEC 11
  // SPEC 8: update 1 uses lr(0) = --lr-warmup-init = 0 (exact).
  EXPECT_EQ(learning_rate<double>(schedule, scheduler_samples_before_update(1, gbs)), 0.0);
  // Update 1,272 is the last warmup update: lr = 8e-5 x 1271/1272 (approximate, 3 roundings).
  EXPECT_NEAR(learning_rate<double>(schedule, scheduler_samples_before_update(1272, gbs)),
              8e-5 * 1271.0 / 1272.0, 2.0 * kEpsilon * 8e-5);
  // Update 1,273 starts at n = W = 2,442,240: the peak (approximate, 3 roundings).
  EXPECT_EQ(scheduler_samples_before_update(1273, gbs), 2'442'240);
  EXPECT_NEAR(learning_rate<double>(schedule, 2'442'240), 8e-5, 2.0 * kEpsilon * 8e-5);
  // Halfway through the decay span, W + (D - W)/2 = 611,571,840 = 318,527 x 1920: the mean of
  // max and min, 0.5 x (8e-5 + 8e-6) = 4.4e-5 (SPEC 11). Approximate: cos(pi/2) in double is
  // 6.1e-17, below half an ulp of 1, so coeff is exactly 0.5; what remains is the rounding of
  // max - min, the product and the sum: 2 eps x 8e-5 bounds it.
  EXPECT_NEAR(learning_rate<double>(schedule, 611'571'840), 0.5 * (8e-5 + 8e-6),
              2.0 * kEpsilon * 8e-5);
  // After D the floor, exactly.
  EXPECT_EQ(learning_rate<double>(schedule, 635782 * gbs + 1), 8e-6);
}

// ---- Weight decay (SPEC 8, Megatron's get_wd) ----

ScheduleConfig draw_wd_schedule(WeightDecayIncrStyle style) {
  ScheduleConfig schedule;
  schedule.weight_decay_incr_style = style;
  schedule.start_weight_decay =
      static_cast<double>(*rc::gen::inRange<std::int64_t>(0, 1 << 20)) / (1 << 20);
  schedule.end_weight_decay = style == WeightDecayIncrStyle::constant
                                  ? schedule.start_weight_decay
                                  : static_cast<double>(*rc::gen::inRange<std::int64_t>(0, 1 << 20)) /
                                        (1 << 20);
  schedule.weight_decay = schedule.end_weight_decay;
  schedule.wd_incr_samples = *rc::gen::inRange<std::int64_t>(1, 100'000'000);
  return schedule;
}

RC_GTEST_PROP(WeightDecay, ConstantStyleIsTheCoefficientEverywhere, ()) {
  const ScheduleConfig schedule = draw_wd_schedule(WeightDecayIncrStyle::constant);
  const auto n = *rc::gen::inRange<std::int64_t>(0, 2 * schedule.wd_incr_samples);
  RC_ASSERT(weight_decay_at<double>(schedule, n) == schedule.end_weight_decay);  // exact
}

RC_GTEST_PROP(WeightDecay, IncrementStylesRunFromStartToEnd, ()) {
  const ScheduleConfig schedule = draw_wd_schedule(
      *rc::gen::element(WeightDecayIncrStyle::linear, WeightDecayIncrStyle::cosine));
  const std::int64_t span = schedule.wd_incr_samples;
  // Exact at 0: linear coeff 0; cosine 0.5 x (cos(pi x 1) + 1) = 0 (cos(double pi) rounds to -1).
  RC_ASSERT(weight_decay_at<double>(schedule, 0) == schedule.start_weight_decay);
  // Exact after the span: Megatron returns end itself.
  const auto beyond = *rc::gen::inRange<std::int64_t>(1, 1'000'000);
  RC_ASSERT(weight_decay_at<double>(schedule, span + beyond) == schedule.end_weight_decay);
  // At the span's end coeff is 1 and start + (end - start) rounds at most twice (values <= 1).
  RC_ASSERT(std::abs(weight_decay_at<double>(schedule, span) - schedule.end_weight_decay) <=
            2.0 * kEpsilon);
  // Moves monotonically toward end (exact, as for the lr).
  const auto a = *rc::gen::inRange<std::int64_t>(0, span + 1);
  const auto b = *rc::gen::inRange<std::int64_t>(a, span + 1);
  const double wd_a = weight_decay_at<double>(schedule, a);
  const double wd_b = weight_decay_at<double>(schedule, b);
  if (schedule.end_weight_decay >= schedule.start_weight_decay) {
    RC_ASSERT(wd_a <= wd_b);
  } else {
    RC_ASSERT(wd_a >= wd_b);
  }
}

TEST(WeightDecay, CosineIncrementIsHalfwayAtTheMiddle) {
  // Megatron: coeff = 0.5 x (cos(pi x (1 - 1/2)) + 1) = 0.5 in exact arithmetic; in double
  // cos(pi/2) = 6.1e-17 is below half an ulp of 1, so coeff is exactly 0.5 and wd = 0.25 + 0.5 x
  // 0.5 = 0.5 exactly (dyadic).
  ScheduleConfig schedule;
  schedule.weight_decay_incr_style = WeightDecayIncrStyle::cosine;
  schedule.start_weight_decay = 0.25;
  schedule.end_weight_decay = 0.75;
  schedule.wd_incr_samples = 1000;
  EXPECT_EQ(weight_decay_at<double>(schedule, 500), 0.5);
}

TEST(Schedule, UpdateKStartsAfterKMinusOneBatches) {
  EXPECT_EQ(scheduler_samples_before_update(1, 1920), 0);  // SPEC 8: the first update uses lr(0)
  EXPECT_EQ(scheduler_samples_before_update(635782, 1920), 635781 * 1920);
}

// ---- `tandem schedule` (SPEC 12) ----

// A tiny run: 100 samples / GBS 8 = 12 updates (remainder 4), warmup 16 samples, cosine.
std::vector<std::string> small_run() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
          "--seq-length", "16", "--global-batch-size", "8", "--train-samples", "100",
          "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-samples", "16",
          "--lr-decay-style", "cosine"};
}

using testing::parse_run;
using testing::with;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  for (std::string field; std::getline(in, field, ',');) fields.push_back(field);
  return fields;
}

TEST(ScheduleCommand, CsvHasTheSpecHeaderAndEveryNthUpdatePlusTheLast) {
  const auto csv = testing::run_tandem(with({"schedule", "--every", "5", "--csv"}, small_run()));
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  const RunConfig config = parse_run(small_run());
  const std::vector<std::string> lines = lines_of(csv.output);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "update,consumed_samples,lr,wd");  // SPEC 12, exactly
  // floor(100 / 8) = 12 updates; every 5th from 1: 1, 6, 11, and the last, 12.
  const std::vector<std::int64_t> expected_updates = {1, 6, 11, 12};
  ASSERT_EQ(lines.size(), 1 + expected_updates.size()) << csv.output;
  for (std::size_t i = 0; i < expected_updates.size(); ++i) {
    const auto fields = split_commas(lines[i + 1]);
    ASSERT_EQ(fields.size(), 4u) << lines[i + 1];
    const std::int64_t update = expected_updates[i];
    const std::int64_t consumed = (update - 1) * 8;  // SPEC 12: at the start of the update
    EXPECT_EQ(std::stoll(fields[0]), update);
    EXPECT_EQ(std::stoll(fields[1]), consumed);
    // Exact: the CSV prints the shortest text that reads back as the same double.
    EXPECT_EQ(std::strtod(fields[2].c_str(), nullptr), learning_rate<double>(config.schedule, consumed))
        << "update " << update;
    EXPECT_EQ(std::strtod(fields[3].c_str(), nullptr),
              weight_decay_at<double>(config.schedule, consumed))
        << "update " << update;
  }
  // Update 1 uses --lr-warmup-init (0), SPEC 8.
  EXPECT_EQ(split_commas(lines[1])[2], "0");
}

TEST(ScheduleCommand, JsonIsAnArrayOfTheSameRows) {
  std::vector<std::string> arguments = with({"schedule", "--json"}, small_run());
  const auto result = testing::run_tandem(arguments);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json rows = nlohmann::json::parse(result.output);
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 12u);  // --every 1: all floor(100/8) updates
  const RunConfig config = parse_run(small_run());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto update = static_cast<std::int64_t>(i + 1);
    EXPECT_EQ(rows[i].at("update").get<std::int64_t>(), update);
    EXPECT_EQ(rows[i].at("consumed_samples").get<std::int64_t>(), (update - 1) * 8);
    EXPECT_EQ(rows[i].at("lr").get<double>(),
              learning_rate<double>(config.schedule, (update - 1) * 8));
    EXPECT_EQ(rows[i].at("wd").get<double>(),
              weight_decay_at<double>(config.schedule, (update - 1) * 8));
  }
}

TEST(ScheduleCommand, BadOutputOptionsAreErrors) {
  EXPECT_EQ(testing::run_tandem(with({"schedule", "--every", "0"}, small_run()), "", "2>/dev/null")
                .exit_code,
            2);
  EXPECT_EQ(testing::run_tandem(with({"schedule", "--csv", "--json"}, small_run()), "",
                                "2>/dev/null")
                .exit_code,
            2);
}

// A fresh directory under the system's temporary directory, removed afterwards.
struct TemporaryDirectory {
  fs::path path;
  TemporaryDirectory() {
    std::string pattern = (fs::temp_directory_path() / "tandem-schedule-test-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

bool gnuplot_installed() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

TEST(ScheduleCommand, SvgIsACompleteDrawing) {
  if (!gnuplot_installed()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const TemporaryDirectory directory;
  const fs::path svg = directory.path / "schedule.svg";
  const auto result =
      testing::run_tandem(with({"schedule", "--svg", svg.string()}, small_run()), "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string drawing = read_text(svg);
  EXPECT_NE(drawing.find("<svg"), std::string::npos);
  EXPECT_NE(drawing.find("</svg>"), std::string::npos);
  // Only the drawing is left: no temporary file beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(directory.path), fs::directory_iterator()), 1);
}

TEST(ScheduleCommand, SvgWithoutGnuplotFailsAndSaysWhatToInstall) {
  const TemporaryDirectory directory;
  const fs::path svg = directory.path / "schedule.svg";
  // PATH holds only an empty directory, so no gnuplot can be found.
  const auto result = testing::run_tandem(with({"schedule", "--svg", svg.string()}, small_run()),
                                          "PATH=" + testing::shell_quoted(directory.path.string()) + " ",
                                          "2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("gnuplot-nox"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(svg));
}

TEST(ScheduleCommand, FailingGnuplotLeavesThePreviousFileUntouched) {
  // Negative control for atomic writing: a fake gnuplot writes half an SVG to the file it was told
  // to write, then fails. The target must keep its old content and no temporary may remain.
  const TemporaryDirectory directory;
  const fs::path bin = directory.path / "bin";
  fs::create_directory(bin);
  const fs::path fake = bin / "gnuplot";
  {
    std::ofstream out(fake);
    out << "#!/bin/sh\n"
        << "out=$(sed -n \"s/^set output '\\(.*\\)'$/\\1/p\" \"$1\")\n"
        << "printf '<svg partial' > \"$out\"\n"
        << "exit 1\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  const fs::path svg = directory.path / "schedule.svg";
  {
    std::ofstream out(svg);
    out << "previous";
  }
  const auto result = testing::run_tandem(
      with({"schedule", "--svg", svg.string()}, small_run()),
      "PATH=" + testing::shell_quoted(bin.string()) + ":/usr/bin:/bin ", "2>&1");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_EQ(read_text(svg), "previous");
  // The fake binary's directory and the old drawing only.
  EXPECT_EQ(std::distance(fs::directory_iterator(directory.path), fs::directory_iterator()), 2);
}

}  // namespace
}  // namespace tandem
