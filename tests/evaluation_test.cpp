// Validation during training (docs/DATA.md section 12, Megatron's --eval-interval/--eval-iters):
// the option rules, which iterations evaluate, what one evaluation computes in each twin, and that
// it changes nothing but its own counter, which resumes.
//
// Kinds of comparison:
//   - exact: option errors, the schedule of evaluations, counters, the reference's loss against
//     the training loss of one global batch holding the same samples (the same sum in the same
//     order), bitwise;
//   - deterministic (bitwise): training records with and without evaluation, evaluation records of
//     a straight run and a stopped and resumed one, every DP rank's record;
//   - approximate: production (fp32) against the reference (double) from the same weights, within
//     equivalence/tolerance.hpp's loss_bound for the evaluated K x GBS samples.
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/args.hpp"
#include "core/train/run_support.hpp"
#include "equivalence/tolerance.hpp"
#include "production/local_ranks.hpp"
#include "production/trainer.hpp"
#include "reference/trainer.hpp"
#include "tests/support/parse_run.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_production_run.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

using nlohmann::json;
using testing::parse_run;
using testing::with;

std::uint64_t bits(double value) { return std::bit_cast<std::uint64_t>(value); }

// ---- Options -----------------------------------------------------------------------------------

std::vector<std::string> small_run() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
          "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
          "--train-samples", "16"};
}

// The one issue `arguments` raise: its field, and the whole message holding `fragment`.
void expect_issue(const std::vector<std::string>& arguments, const std::string& field,
                  const std::string& fragment) {
  try {
    parse_run(arguments);
    ADD_FAILURE() << field << ": accepted";
  } catch (const ConfigError& error) {
    ASSERT_EQ(error.issues().size(), 1u) << error.what();
    EXPECT_EQ(error.issues()[0].field, field) << error.what();
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(EvaluationOptions, NoSplitAndNoOptionMeansNoEvaluationAndTheConfigurationReadsAsBefore) {
  const RunConfig config = parse_run(small_run());
  EXPECT_FALSE(config.evaluation.evaluates());
  EXPECT_FALSE(json(config).contains("evaluation"));  // log headers, checkpoints, golden fixtures
}

TEST(EvaluationOptions, AValidationPartInSplitEvaluatesWithMegatronsDefaults) {
  // Megatron Core 0.19: --eval-iters 100, --eval-interval unset (only the evaluation at the end).
  const RunConfig config = parse_run(with(small_run(), {"--split", "90,10,0"}));
  EXPECT_TRUE(config.evaluation.evaluates());
  EXPECT_EQ(config.evaluation.eval_iters, 100);
  EXPECT_EQ(config.evaluation.eval_interval, 0);
  const json section = json(config).at("evaluation");
  EXPECT_EQ(section.at("eval_iters"), 100);
  EXPECT_EQ(section.at("eval_interval"), 0);

  const RunConfig given = parse_run(with(small_run(), {"--split", "90,10,0", "--eval-interval", "2", "--eval-iters", "3"}));
  EXPECT_EQ(given.evaluation.eval_interval, 2);
  EXPECT_EQ(given.evaluation.eval_iters, 3);
}

TEST(EvaluationOptions, AskingForEvaluationWithoutAValidationSplitIsAnError) {
  expect_issue(with(small_run(), {"--eval-iters", "5"}), "--eval-iters", "--split 969,30,1");
  expect_issue(with(small_run(), {"--eval-interval", "10"}), "--eval-interval", "without --split");
  expect_issue(with(small_run(), {"--split", "90,0,10", "--eval-iters", "5"}), "--eval-iters",
               "weight 0");
}

TEST(EvaluationOptions, ZeroAsksForNothingAndNegativeCountsAreErrors) {
  EXPECT_FALSE(parse_run(with(small_run(), {"--eval-iters", "0"})).evaluation.evaluates());
  EXPECT_FALSE(parse_run(with(small_run(), {"--eval-interval", "0"})).evaluation.evaluates());
  const RunConfig off = parse_run(with(small_run(), {"--split", "90,10,0", "--eval-iters", "0", "--eval-interval", "5"}));
  EXPECT_FALSE(off.evaluation.evaluates());
  EXPECT_FALSE(json(off).contains("evaluation"));
  expect_issue(with(small_run(), {"--split", "90,10,0", "--eval-iters", "-1"}), "--eval-iters", ">= 0");
  expect_issue(with(small_run(), {"--split", "90,10,0", "--eval-interval", "-2"}), "--eval-interval", ">= 0");
}

// ---- Which iterations evaluate (drive_iterations) ------------------------------------------------

// A trainer stand-in that records what the loop asks of it, in order.
struct ScriptedRun {
  Counters counters;
  std::vector<std::string> events;

  IterationDriver driver() {
    IterationDriver out;
    out.run_iteration = [this] {
      counters.iteration += 1;
      events.push_back("iter " + std::to_string(counters.iteration));
      IterationRecord record;
      record.iteration = counters.iteration;
      return record;
    };
    out.counters = [this] { return counters; };
    out.save = [this] { events.push_back("save " + std::to_string(counters.iteration)); };
    out.evaluate = [this] {
      counters.consumed_valid_samples += 4;
      events.push_back("eval " + std::to_string(counters.iteration));
      EvaluationRecord record;
      record.iteration = counters.iteration;
      record.consumed_valid_samples = counters.consumed_valid_samples;
      return record;
    };
    return out;
  }
};

std::vector<std::string> schedule_of(std::int64_t iterations, std::int64_t eval_interval,
                                     std::int64_t save_interval, std::int64_t exit_interval,
                                     std::string* printed = nullptr) {
  RunConfig config;
  config.batch.global_batch_size = 4;
  config.schedule.train_samples = iterations * 4;
  config.checkpoint.save_interval = save_interval;
  config.evaluation.eval_interval = eval_interval;
  config.evaluation.eval_iters = 1;
  TrainOptions options;
  options.quiet = true;
  options.exit_interval = exit_interval;
  ScriptedRun run;
  JsonlLog no_log;
  std::ostringstream out;
  drive_iterations(config, options, 0, run.driver(), no_log, out);
  if (printed != nullptr) *printed = out.str();
  return run.events;
}

TEST(EvaluationSchedule, EveryIntervalBeforeItsCheckpointAndOnceMoreAfterTheLastIteration) {
  std::string printed;
  const std::vector<std::string> expected = {"iter 1", "iter 2", "iter 3", "eval 3", "save 3",
                                             "iter 4", "iter 5", "iter 6", "eval 6", "save 6",
                                             "iter 7", "save 7", "eval 7"};
  EXPECT_EQ(schedule_of(7, 3, 3, 0, &printed), expected);
  EXPECT_NE(printed.find("validation loss at iteration 3 | lm loss value: "), std::string::npos) << printed;
  EXPECT_NE(printed.find("validation loss at iteration 7 on validation set | "), std::string::npos) << printed;
}

TEST(EvaluationSchedule, ALastIterationOnTheIntervalEvaluatesTwiceAsMegatronDoes) {
  const std::vector<std::string> expected = {"iter 1", "iter 2", "eval 2", "iter 3", "iter 4",
                                             "eval 4", "save 4", "eval 4"};
  EXPECT_EQ(schedule_of(4, 2, 0, 0), expected);
}

TEST(EvaluationSchedule, NoIntervalEvaluatesOnlyAtTheEnd) {
  const std::vector<std::string> expected = {"iter 1", "iter 2", "iter 3", "save 3", "eval 3"};
  EXPECT_EQ(schedule_of(3, 0, 0, 0), expected);
}

TEST(EvaluationSchedule, ARunThatExitsEarlyDoesNotEvaluateAtTheEnd) {
  const std::vector<std::string> expected = {"iter 1", "iter 2", "eval 2", "iter 3", "save 3"};
  EXPECT_EQ(schedule_of(6, 2, 0, 3), expected);
}

// ---- What one evaluation computes ----------------------------------------------------------------

constexpr std::int64_t kEvalIters = 3;

// The tiny model with mbs 1, the global batch `gbs` on `ranks` replicas, 8 updates.
RunConfig tiny_run(std::int64_t ranks, std::int64_t gbs) {
  RunConfig config = testing::tiny_data_parallel_run(ranks, gbs);
  config.optimizer.clip_grad = 0.5;
  config.schedule.lr = 1e-2;  // large enough that two updates move the loss visibly
  config.evaluation.eval_iters = kEvalIters;
  return config;
}

// A validation stream unlike the training one (other lengths, other tokens).
testing::StreamSamples validation_samples() {
  testing::StreamSamples samples;
  samples.stream = testing::document_stream({11, 2, 31, 6, 50, 4, 19}, 200, 29);
  samples.seq_length = 32;
  return samples;
}

// One global batch of K x GBS samples: its first training iteration reads validation samples
// [consumed, consumed + K x GBS) in SPEC 2's order, microbatch m' = j*M + m on replica r taking
// consumed + j*GBS + m*mbs*DP + r*mbs: evaluation batch j's microbatch m, in the same order.
RunConfig one_batch_of_every_evaluated_sample(RunConfig config) {
  config.batch.global_batch_size *= kEvalIters;
  config.schedule.train_samples = config.batch.global_batch_size;
  config.schedule.lr_decay_samples = config.batch.global_batch_size;
  return config;
}

TEST(ReferenceEvaluation, EqualsTheTrainingLossOfOneBatchOfTheSameSamplesAndChangesNothingElse) {
  for (const std::int64_t ranks : {1, 2}) {
    SCOPED_TRACE("DP " + std::to_string(ranks));
    const RunConfig config = tiny_run(ranks, 4);
    const reference::SampleProvider validation = validation_samples();
    reference::Trainer<double> trainer(config, testing::tiny_production_samples());
    trainer.run_iteration();
    trainer.run_iteration();
    const reference::TrainerState<double> before = trainer.state();

    const EvaluationRecord first = trainer.evaluate(validation, kEvalIters);
    // Nothing but consumed_valid_samples changed: weights, moments, every training counter.
    EXPECT_EQ(trainer.state().params, before.params);
    EXPECT_EQ(trainer.state().exp_avg, before.exp_avg);
    EXPECT_EQ(trainer.state().exp_avg_sq, before.exp_avg_sq);
    Counters expected_counters = before.counters;
    expected_counters.consumed_valid_samples = kEvalIters * 4;
    EXPECT_EQ(trainer.state().counters, expected_counters);
    EXPECT_EQ(first.iteration, 2);
    EXPECT_EQ(first.samples, kEvalIters * 4);
    EXPECT_EQ(first.consumed_valid_samples, kEvalIters * 4);
    ASSERT_TRUE(std::isfinite(first.loss));
    ASSERT_GT(first.loss, 0.0);
    EXPECT_EQ(bits(first.ppl), bits(std::exp(first.loss)));  // below Megatron's cap of 20

    // The direct computation: the training loss (taken before its update) of one global batch
    // holding exactly the evaluated samples, at the same weights: the same sum, bit for bit.
    const RunConfig wide = one_batch_of_every_evaluated_sample(config);
    reference::Trainer<double> direct(wide, validation);
    direct.state().params = trainer.state().params;
    const IterationRecord direct_record = direct.run_iteration();
    EXPECT_EQ(bits(first.loss), bits(direct_record.loss)) << first.loss << " vs " << direct_record.loss;
    EXPECT_EQ(first.loss_tokens, direct_record.loss_tokens);

    // The next evaluation continues after the first's samples.
    const EvaluationRecord second = trainer.evaluate(validation, kEvalIters);
    EXPECT_EQ(second.consumed_valid_samples, 2 * kEvalIters * 4);
    reference::Trainer<double> next(wide, validation);
    next.state().params = trainer.state().params;
    next.state().counters.consumed_samples = kEvalIters * 4;
    const IterationRecord next_record = next.run_iteration();
    EXPECT_EQ(bits(second.loss), bits(next_record.loss));
    // Negative control: other samples, another loss (the check above can tell them apart).
    EXPECT_NE(bits(second.loss), bits(direct_record.loss));
  }
}

TEST(ProductionEvaluation, CpuEqualsTheReferenceWithinTheLossBoundOnOneAndTwoRanks) {
  for (const std::int64_t ranks : {1, 2}) {
    SCOPED_TRACE("DP " + std::to_string(ranks));
    const RunConfig config = tiny_run(ranks, 4);
    const production::SampleProvider validation = validation_samples();
    production::ProductionOptions options;
    options.device = production::Device::cpu;
    production::LocalRanks production_ranks(config, testing::tiny_production_samples(), options,
                                            production::LocalRanks::Transport::threads);
    std::vector<IterationRecord> last(production_ranks.size());
    for (int update = 0; update < 2; ++update) {
      production_ranks.each([&](production::Trainer& trainer, int rank) {
        last[static_cast<std::size_t>(rank)] = trainer.run_iteration();
      });
    }
    std::vector<production::HostState> states(production_ranks.size());
    production_ranks.each([&](production::Trainer& trainer, int rank) {
      states[static_cast<std::size_t>(rank)] = trainer.host_state();
    });
    std::vector<EvaluationRecord> evaluations(production_ranks.size());
    production_ranks.each([&](production::Trainer& trainer, int rank) {
      evaluations[static_cast<std::size_t>(rank)] = trainer.evaluate(validation, kEvalIters);
    });
    // Deterministic: every rank reports the same evaluation.
    for (const EvaluationRecord& evaluation : evaluations) {
      EXPECT_EQ(bits(evaluation.loss), bits(evaluations.front().loss));
      EXPECT_EQ(evaluation.consumed_valid_samples, kEvalIters * 4);
    }
    // Evaluation changes no training state: the next update equals one without it.
    std::vector<production::HostState> after(production_ranks.size());
    production_ranks.each([&](production::Trainer& trainer, int rank) {
      after[static_cast<std::size_t>(rank)] = trainer.host_state();
    });
    EXPECT_EQ(after.front().params, states.front().params);
    EXPECT_EQ(after.front().exp_avg, states.front().exp_avg);
    EXPECT_EQ(after.front().exp_avg_sq, states.front().exp_avg_sq);

    // The reference from the same weights (production's fp32, widened exactly).
    reference::Trainer<double> reference_trainer(config, testing::tiny_production_samples());
    reference_trainer.state().params.assign(states.front().params.begin(), states.front().params.end());
    const EvaluationRecord expected = reference_trainer.evaluate(validation, kEvalIters);
    const EvaluationRecord& got = evaluations.front();
    ASSERT_TRUE(std::isfinite(got.loss));
    EXPECT_EQ(got.loss_tokens, expected.loss_tokens);
    EXPECT_EQ(got.samples, expected.samples);
    // Approximate: the loss bound of the evaluated mean, whose sums run over K x GBS samples.
    const double bound = equivalence::loss_bound(
        equivalence::reduction_shape(one_batch_of_every_evaluated_sample(config)),
        {equivalence::fp32(), equivalence::fp64()}, expected.loss, config.model.padded_vocab_size);
    const double error = std::abs(got.loss - expected.loss);
    EXPECT_LE(error, bound) << "production " << got.loss << " reference " << expected.loss
                            << " error " << error << " bound " << bound << " ("
                            << 100.0 * error / bound << "% of bound)";
  }
}

TEST(ProductionEvaluation, IsBitwiseTheSameOnOneAndTwoRanks) {
  // mbs 1: the K x GBS samples' row sums are per sample and the microbatches are added in global
  // order (m, then rank), so from the same (initial, SPEC 4) weights DP 1 and DP 2 agree exactly.
  std::vector<EvaluationRecord> by_ranks;
  for (const std::int64_t ranks : {1, 2}) {
    const RunConfig config = tiny_run(ranks, 4);
    production::ProductionOptions options;
    options.device = production::Device::cpu;
    production::LocalRanks production_ranks(config, testing::tiny_production_samples(), options,
                                            production::LocalRanks::Transport::threads);
    std::vector<EvaluationRecord> evaluations(production_ranks.size());
    const production::SampleProvider validation = validation_samples();
    production_ranks.each([&](production::Trainer& trainer, int rank) {
      evaluations[static_cast<std::size_t>(rank)] = trainer.evaluate(validation, kEvalIters);
    });
    by_ranks.push_back(evaluations.back());
  }
  EXPECT_EQ(bits(by_ranks[0].loss), bits(by_ranks[1].loss)) << by_ranks[0].loss << " vs " << by_ranks[1].loss;
  EXPECT_EQ(by_ranks[0].loss_tokens, by_ranks[1].loss_tokens);
  EXPECT_EQ(by_ranks[0].consumed_valid_samples, by_ranks[1].consumed_valid_samples);
}

TEST(ProductionEvaluation, LossOnlyRowLossesEqualTheTrainingPathsBitForBit) {
  // The loss-only cross-entropy writes the same row losses as the one that also stores the
  // gradient, so evaluation at the training weights reproduces the training loss of a batch.
  const RunConfig config = tiny_run(1, 4);
  const production::SampleProvider validation = validation_samples();
  production::ProductionOptions options;
  options.device = production::Device::cpu;
  production::Trainer trainer(config, testing::tiny_production_samples(), options);
  const EvaluationRecord evaluation = trainer.evaluate(validation, kEvalIters);
  production::Trainer direct(one_batch_of_every_evaluated_sample(config), validation, options);
  const IterationRecord record = direct.run_iteration();  // same initial weights (SPEC 4)
  EXPECT_EQ(evaluation.loss_tokens, record.loss_tokens);
  // One running sum over the batches' microbatches, as the wide batch sums its microbatches: the
  // same terms in the same order, so the same double.
  EXPECT_EQ(bits(evaluation.loss), bits(record.loss)) << evaluation.loss << " vs " << record.loss;
}

// ---- The binary ----------------------------------------------------------------------------------

struct Log {
  json header;
  std::vector<json> iterations;
  std::vector<json> evaluations;
};

Log read_log(const std::filesystem::path& path) {
  Log log;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    json record = json::parse(line);
    const std::string type = record.at("type");
    if (type == "header") log.header = record;
    if (type == "iteration") log.iterations.push_back(record);
    if (type == "evaluation") log.evaluations.push_back(record);
  }
  return log;
}

// A record without its wall-clock fields (they differ run to run).
json timeless(json record) {
  for (const char* key : {"seconds", "tokens_per_second", "model_flops_per_second", "mfu"}) record.erase(key);
  return record;
}

class EvaluationCli : public testing::TinyTrainCli {
 protected:
  static std::vector<std::vector<std::string>> engines() {
    return {{"--engine", "reference"}, {"--engine", "production", "--device", "cpu"}};
  }
  Log train(const std::vector<std::string>& engine, const std::string& name,
            std::vector<std::string> extra, int expected_exit = 0) {
    const auto log = root_ / (name + ".jsonl");
    extra.insert(extra.end(), {"--log", log.string()});
    const auto result = testing::run_tandem(tiny_train(engine, extra), "", "2>&1");
    EXPECT_EQ(result.exit_code, expected_exit) << result.output;
    return read_log(log);
  }
};

TEST_F(EvaluationCli, TrainingIsBitwiseTheSameWithAndWithoutEvaluation) {
  for (const auto& engine : engines()) {
    SCOPED_TRACE(engine[1]);
    const Log without = train(engine, engine[1] + "_without", {"--split", "90,10,0", "--eval-iters", "0"});
    const Log with_evaluation = train(engine, engine[1] + "_with",
                                      {"--split", "90,10,0", "--eval-interval", "2", "--eval-iters", "2"});
    ASSERT_EQ(without.iterations.size(), 6u);
    ASSERT_EQ(with_evaluation.iterations.size(), 6u);
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(timeless(without.iterations[i]), timeless(with_evaluation.iterations[i])) << "iteration " << i + 1;
    }
    EXPECT_TRUE(without.evaluations.empty());
    EXPECT_FALSE(without.header.at("config").contains("evaluation"));
    EXPECT_EQ(with_evaluation.header.at("config").at("evaluation").at("eval_interval"), 2);
    EXPECT_EQ(with_evaluation.header.at("config").at("evaluation").at("eval_iters"), 2);

    // Iterations 2, 4, 6, and once more at the end; each reads 2 x GBS = 8 fresh samples.
    ASSERT_EQ(with_evaluation.evaluations.size(), 4u);
    const std::vector<std::int64_t> iterations = {2, 4, 6, 6};
    for (std::size_t e = 0; e < 4; ++e) {
      const json& record = with_evaluation.evaluations[e];
      EXPECT_EQ(record.at("iteration"), iterations[e]);
      EXPECT_EQ(record.at("split"), "valid");
      EXPECT_EQ(record.at("at_end"), e == 3);
      EXPECT_EQ(record.at("samples"), 8);
      EXPECT_EQ(record.at("consumed_valid_samples"), 8 * static_cast<std::int64_t>(e + 1));
      const double loss = record.at("loss");
      ASSERT_TRUE(std::isfinite(loss) && loss > 0.0) << record;
      EXPECT_GT(record.at("loss_tokens").get<std::int64_t>(), 0);
      EXPECT_EQ(bits(record.at("ppl").get<double>()), bits(std::exp(std::min(20.0, loss))));
    }
  }
}

TEST_F(EvaluationCli, AResumedRunContinuesTheValidationSamplesBitExactly) {
  for (const auto& engine : engines()) {
    SCOPED_TRACE(engine[1]);
    const std::vector<std::string> evaluation = {"--split", "90,10,0", "--eval-interval", "2", "--eval-iters", "2"};
    const Log straight = train(engine, engine[1] + "_straight", with(evaluation, {"--save", (root_ / (engine[1] + "_a")).string()}));
    const std::string stopped_dir = (root_ / (engine[1] + "_b")).string();
    train(engine, engine[1] + "_stopped", with(evaluation, {"--save", stopped_dir, "--exit-interval", "3"}));
    const Log resumed = train(engine, engine[1] + "_stopped", with(evaluation, {"--save", stopped_dir, "--load", stopped_dir}));
    // The stopped run's log continues: evaluations at 2 (before the stop), then 4, 6 and the end.
    ASSERT_EQ(straight.evaluations.size(), 4u);
    ASSERT_EQ(resumed.evaluations.size(), 4u);
    for (std::size_t e = 0; e < 4; ++e) {
      EXPECT_EQ(timeless(straight.evaluations[e]), timeless(resumed.evaluations[e])) << "evaluation " << e;
    }

    // A checkpoint written before the counter existed resumes it at 0 (Megatron's default).
    const std::string old_dir = (root_ / (engine[1] + "_old")).string();
    train(engine, engine[1] + "_old", with(evaluation, {"--save", old_dir, "--exit-interval", "3"}));
    const auto manifest_path = std::filesystem::path(old_dir) / "iter_0000003" / "manifest.json";
    json manifest = json::parse(std::ifstream(manifest_path));
    ASSERT_EQ(manifest.at("counters").at("consumed_valid_samples"), 8);
    manifest.at("counters").erase("consumed_valid_samples");
    manifest.erase("manifest_crc32");  // written later than the counter too
    std::ofstream(manifest_path) << manifest.dump();
    const Log from_old = train(engine, engine[1] + "_from_old", with(evaluation, {"--load", old_dir}));
    ASSERT_EQ(from_old.evaluations.size(), 3u);  // 4, 6, the end
    EXPECT_EQ(from_old.evaluations[0].at("consumed_valid_samples"), 8);  // read [0, 8) again
    json first_again = timeless(from_old.evaluations[0]);
    json straight_first = timeless(straight.evaluations[0]);
    EXPECT_EQ(first_again.at("loss_tokens"), straight_first.at("loss_tokens"));
  }
}

TEST_F(EvaluationCli, EvaluationWithoutAValidationSplitIsAClearErrorWithExitTwo) {
  const auto result = testing::run_tandem(tiny_train({"--engine", "reference"}, {"--eval-iters", "5"}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--eval-iters = 5"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("fix: give the validation part a weight, e.g. --split 969,30,1"),
            std::string::npos) << result.output;
}

TEST_F(EvaluationCli, PlanPrintsTheEvaluationSettings) {
  const std::vector<std::string> run = with(small_run(), {"--split", "90,10,0", "--eval-interval", "2", "--eval-iters", "3"});
  const auto text = testing::run_tandem(with({"plan"}, run), "", "2>&1");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("3 batches = 12 samples every 2 updates and at the end"), std::string::npos) << text.output;
  const auto plan_json = testing::run_tandem(with({"plan", "--json"}, run), "", "2>/dev/null");
  ASSERT_EQ(plan_json.exit_code, 0) << plan_json.output;
  EXPECT_EQ(json::parse(plan_json.output).at("config").at("evaluation").at("eval_iters"), 3);
  const auto without = testing::run_tandem(with({"plan"}, small_run()), "", "2>&1");
  EXPECT_NE(without.output.find("none (needs a validation part in --split"), std::string::npos) << without.output;
}

TEST_F(EvaluationCli, AuditReadsALogWithEvaluationRecords) {
  const auto log = root_ / "audited.jsonl";
  const auto result = testing::run_tandem(
      tiny_train({"--engine", "reference"}, {"--split", "90,10,0", "--eval-interval", "3", "--eval-iters", "1",
                                             "--audit-params", "4", "--log", log.string()}), "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_EQ(read_log(log).evaluations.size(), 3u);  // 3, 6, the end
  const auto audit = testing::run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  EXPECT_NE(audit.output.find("6 iterations"), std::string::npos) << audit.output;
}

TEST_F(EvaluationCli, ProductionOnTwoMpiRanksEvaluatesAsTheReferenceWithinTheLossBound) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not on the PATH";
  // One update whose lr is --lr-warmup-init 0 (SPEC 8): the weights stay the initial fp32 values
  // in both twins, so the evaluation at the end compares the same model.
  const std::vector<std::string> extra = {"--train-samples", "4", "--lr-decay-samples", "24",
                                          "--split", "90,10,0", "--eval-iters", "3"};
  const auto production_log = root_ / "production.jsonl";
  const auto production = testing::run_tandem(
      tiny_train({"--engine", "production", "--device", "cpu"}, with(extra, {"--log", production_log.string()})),
      mpirun, "2>&1");
  ASSERT_EQ(production.exit_code, 0) << production.output;
  const Log reference = train({"--engine", "reference"}, "reference", with(extra, {"--data-parallel-size", "2"}));
  const Log got = read_log(production_log);
  EXPECT_EQ(got.header.at("data_parallel").at("ranks"), 2);
  ASSERT_EQ(got.evaluations.size(), 1u);
  ASSERT_EQ(reference.evaluations.size(), 1u);
  const json& p = got.evaluations[0];
  const json& r = reference.evaluations[0];
  EXPECT_EQ(p.at("loss_tokens"), r.at("loss_tokens"));
  EXPECT_EQ(p.at("consumed_valid_samples"), 12);
  EXPECT_EQ(r.at("consumed_valid_samples"), 12);
  RunConfig config = parse_run({"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--group-query-attention", "--num-query-groups", "2", "--seq-length", "32",
                                "--micro-batch-size", "2", "--global-batch-size", "12", "--train-samples", "12"});
  const double bound = equivalence::loss_bound(equivalence::reduction_shape(config),
                                               {equivalence::fp32(), equivalence::fp64()},
                                               r.at("loss").get<double>(), config.model.padded_vocab_size);
  const double error = std::abs(p.at("loss").get<double>() - r.at("loss").get<double>());
  EXPECT_LE(error, bound) << "production " << p.at("loss") << " reference " << r.at("loss") << " error "
                          << error << " bound " << bound;
}

}  // namespace
}  // namespace tandem
