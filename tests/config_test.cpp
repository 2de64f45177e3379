// Configuration: every validation rule of the foundation issue gets its error (naming the field)
// in-process, and bad input through the real binary exits non-zero with that error on stderr.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/args.hpp"
#include "tests/support/parse_run.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

// Parses `arguments` (without the program name) as a subcommand with the run options would.
RunConfig parse(const std::vector<std::string>& arguments) { return testing::parse_run(arguments); }

// The smallest valid configuration the rules below perturb one field at a time.
std::vector<std::string> valid() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
          "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
          "--train-samples", "64", "--lr", "1e-3"};
}

using testing::with;

// Expects a ConfigError with an issue about `field`; returns its message for further checks.
std::string expect_issue(const std::vector<std::string>& arguments, const std::string& field) {
  try {
    parse(arguments);
  } catch (const ConfigError& error) {
    for (const auto& issue : error.issues()) {
      if (issue.field.find(field) != std::string::npos) {
        EXPECT_FALSE(issue.rule.empty());
        EXPECT_FALSE(issue.fix.empty());
        return error.what();
      }
    }
    ADD_FAILURE() << "error did not name " << field << ":\n" << error.what();
    return error.what();
  }
  ADD_FAILURE() << "no error for " << field;
  return {};
}

TEST(Config, MegatronDataOrderRefusesWhatMegatronCannotDo) {
  EXPECT_EQ(parse(with(valid(), {"--data-order", "megatron"})).data.data_order, DataOrder::megatron);
  // Megatron's GPTDataset only concatenates; numpy's RandomState takes seeds below 2^32.
  expect_issue(with(valid(), {"--data-order", "megatron", "--packing", "units"}), "--packing");
  expect_issue(with(valid(), {"--data-order", "megatron", "--seed", "4294967296"}), "--seed");
  EXPECT_EQ(parse(with(valid(), {"--data-order", "megatron", "--seed", "4294967295"})).data.seed,
            4294967295u);
  EXPECT_EQ(parse(with(valid(), {"--packing", "units", "--seed", "4294967296"})).data.seed,
            4294967296u);  // tandem's own orders take any 64-bit seed
  expect_issue(with(valid(), {"--data-order", "random"}), "--data-order");
}

TEST(Config, RecomputationFollowsMegatronsRules) {
  const RunConfig none = parse(valid());
  EXPECT_EQ(none.recompute.granularity, RecomputeGranularity::none);
  const RunConfig full =
      parse(with(valid(), {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"}));
  EXPECT_EQ(full.recompute.granularity, RecomputeGranularity::full);
  EXPECT_EQ(full.recompute.method, RecomputeMethod::block);
  EXPECT_EQ(full.recompute.num_layers, 2);
  EXPECT_EQ(parse(with(valid(), {"--recompute-activations"})).recompute.granularity, RecomputeGranularity::selective);
  // TransformerConfig.__post_init__: full needs a method and a number of layers; selective takes no
  // number; unknown values are refused.
  expect_issue(with(valid(), {"--recompute-granularity", "full", "--recompute-num-layers", "1"}), "--recompute-method");
  expect_issue(with(valid(), {"--recompute-granularity", "full", "--recompute-method", "uniform"}),
               "--recompute-num-layers");
  expect_issue(with(valid(), {"--recompute-granularity", "selective", "--recompute-num-layers", "1"}),
               "--recompute-num-layers");
  expect_issue(with(valid(), {"--recompute-granularity", "layer"}), "--recompute-granularity");
  expect_issue(with(valid(), {"--recompute-granularity", "full", "--recompute-method", "every", "--recompute-num-layers",
                              "1"}),
               "--recompute-method");
  expect_issue(with(valid(), {"--recompute-activations", "--recompute-granularity", "full", "--recompute-method",
                              "uniform", "--recompute-num-layers", "1"}),
               "--recompute-activations");
  // Megatron ignores a method without a granularity; tandem says so.
  const RunConfig ignored = parse(with(valid(), {"--recompute-method", "uniform", "--recompute-num-layers", "1"}));
  EXPECT_EQ(ignored.recompute.granularity, RecomputeGranularity::none);
  ASSERT_EQ(ignored.argument_warnings.size(), none.argument_warnings.size() + 1);
  EXPECT_TRUE(std::any_of(ignored.argument_warnings.begin(), ignored.argument_warnings.end(),
                          [](const std::string& warning) { return warning.find("nothing is recomputed") != std::string::npos; }));
}

TEST(Config, ValidBaselineParsesWithDerivedDefaults) {
  const RunConfig config = parse(valid());
  EXPECT_EQ(config.parallel.data_parallel, 1);
  EXPECT_EQ(config.parallel.world_size, 1);
  EXPECT_EQ(config.microbatches_per_replica(), 4);
  EXPECT_EQ(config.model.num_query_groups, 4);     // = heads without GQA (Megatron)
  EXPECT_EQ(config.model.ffn_hidden_size, 64);     // max(64, int(8*32/3 / 64) * 64)
  EXPECT_EQ(config.model.padded_vocab_size, 384);  // 258 rounded up to 128 x TP (SPEC 12)
  EXPECT_EQ(config.schedule.lr_decay_samples, 64); // defaults to --train-samples (SPEC 12)
  EXPECT_TRUE(config.data.reset_position_ids);
  EXPECT_TRUE(config.data.reset_attention_mask);
  EXPECT_TRUE(config.data.eod_mask_loss);
  EXPECT_EQ(config.data.loss_normalization, LossNormalization::per_token);
}

TEST(Config, MegatronSwigluFfnDefault) {
  // int((4 * 4096 * 2 / 3) / 64) * 64 = 10880 for Llama-2-7B's width.
  const RunConfig config =
      parse(with(valid(), {"--hidden-size", "4096", "--num-attention-heads", "32"}));
  EXPECT_EQ(config.model.ffn_hidden_size, 10880);
}

TEST(Config, GlobalBatchDivisibleByMicroBatchTimesDp) {
  const auto message = expect_issue(
      with(valid(), {"--global-batch-size", "6", "--micro-batch-size", "4"}),
      "--global-batch-size");
  EXPECT_NE(message.find("multiple of 4"), std::string::npos) << message;
  expect_issue(with(valid(), {"--data-parallel-size", "3"}), "--global-batch-size");
}

TEST(Config, WorldSizeEqualsTpPpCpDp) {
  expect_issue(with(valid(), {"--tensor-model-parallel-size", "2", "--num-attention-heads", "4",
                              "--world-size", "3"}),
               "--world-size");
  const RunConfig config = parse(with(valid(), {"--tensor-model-parallel-size", "2",
                                                "--world-size", "8", "--global-batch-size", "8"}));
  EXPECT_EQ(config.parallel.data_parallel, 4);
  expect_issue(with(valid(), {"--world-size", "4", "--data-parallel-size", "2"}),
               "--data-parallel-size");
}

TEST(Config, HiddenDivisibleByHeads) {
  expect_issue(with(valid(), {"--hidden-size", "30"}), "--hidden-size");
}

TEST(Config, HeadsDivisibleByGroupsAndTp) {
  expect_issue(with(valid(), {"--group-query-attention", "--num-query-groups", "3"}),
               "--num-attention-heads");
  expect_issue(with(valid(), {"--tensor-model-parallel-size", "8"}), "--num-attention-heads");
}

// Megatron 0.19: G a multiple of TP (the groups split) or a divisor (TP/G ranks share a group).
TEST(Config, GroupsAMultipleOrADivisorOfTp) {
  const RunConfig shared = parse(with(valid(), {"--group-query-attention", "--num-query-groups", "1",
                                                "--tensor-model-parallel-size", "2"}));
  EXPECT_EQ(shared.model.num_query_groups, 1);
  EXPECT_EQ(shared.parallel.tensor_parallel, 2);
  expect_issue(with(valid(), {"--num-attention-heads", "6", "--hidden-size", "48", "--group-query-attention",
                              "--num-query-groups", "3", "--tensor-model-parallel-size", "2"}),
               "--num-query-groups");
}

// Huge sizes crashed (segfault in the GEMM, SIGFPE in the model) or overflowed silently (a
// 4.6e18-layer plan printed 24,608 parameters): every size and every product is range checked.
TEST(Config, EverySizeAndEveryProductOfSizesFits) {
  const std::string huge = "4611686018427387904";  // 2^62
  for (const char* field : {"--ffn-hidden-size", "--vocab-size", "--make-vocab-size-divisible-by", "--num-layers",
                            "--hidden-size", "--seq-length", "--global-batch-size"}) {
    expect_issue(with(valid(), {field, huge}), field);
  }
  // Each within 2^31 - 1, their products not: 2e9 layers of width 2048 (about 1e17 parameters);
  // a vocabulary padded past 2^31 rows; 2^31 - 1 samples of 2^31 - 1 tokens.
  expect_issue(with(valid(), {"--num-layers", "2000000000", "--hidden-size", "2048", "--num-attention-heads", "16"}),
               "--num-layers");
  expect_issue(with(valid(), {"--make-vocab-size-divisible-by", "2000000000", "--tensor-model-parallel-size", "2"}),
               "--make-vocab-size-divisible-by");
  expect_issue({"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--micro-batch-size", "1",
                "--seq-length", "2147483647", "--global-batch-size", "2147483647", "--train-samples", "2147483647"},
               "--global-batch-size");
  expect_issue({"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
                "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "10", "--lr-warmup-iters", huge},
               "--lr-warmup-iters");
}

TEST(Config, RealValuedSettingsAreFinite) {
  for (const char* field : {"--lr", "--min-lr", "--adam-eps", "--clip-grad", "--weight-decay", "--init-method-std"}) {
    for (const char* value : {"inf", "-inf", "nan", "1e400"}) {
      expect_issue(with(valid(), {field, value}), field);
    }
  }
}

TEST(Config, SequenceParallelSplitsTheSequenceOverTp) {
  expect_issue(with(valid(), {"--seq-length", "18", "--tensor-model-parallel-size", "4", "--sequence-parallel"}),
               "--seq-length");
}

TEST(Config, QueryGroupsNeedGqaFlag) {
  expect_issue(with(valid(), {"--num-query-groups", "2"}), "--num-query-groups");
  expect_issue(with(valid(), {"--group-query-attention"}), "--num-query-groups");
}

TEST(Config, FfnDivisibleByTp) {
  expect_issue(with(valid(), {"--ffn-hidden-size", "65", "--tensor-model-parallel-size", "2"}),
               "--ffn-hidden-size");
}

TEST(Config, LayersDivisibleByPp) {
  expect_issue(with(valid(), {"--num-layers", "3", "--pipeline-model-parallel-size", "2"}),
               "--num-layers");
}

// Megatron warns and turns sequence parallelism off when TP is 1 (it refused before).
TEST(Config, SequenceParallelWithTpOneIsTurnedOffWithAWarning) {
  const RunConfig config = parse(with(valid(), {"--sequence-parallel"}));
  EXPECT_FALSE(config.parallel.sequence_parallel);
  EXPECT_TRUE(std::any_of(config.argument_warnings.begin(), config.argument_warnings.end(),
                          [](const std::string& warning) { return warning.find("--sequence-parallel") != std::string::npos; }));
  EXPECT_TRUE(parse(with(valid(), {"--sequence-parallel", "--tensor-model-parallel-size", "2"})).parallel.sequence_parallel);
}

TEST(Config, SequenceLengthIsAMultipleOfTwiceTheContextRanks) {
  expect_issue(with(valid(), {"--context-parallel-size", "2", "--seq-length", "18"}), "--seq-length");
  EXPECT_EQ(parse(with(valid(), {"--context-parallel-size", "2", "--seq-length", "20"})).parallel.context_parallel, 2);
}

// Megatron has dropout (0.1 by default); tandem's model has none: 0 is accepted, anything else is
// refused, and arguments that leave them out are told what Megatron would do with them.
TEST(Config, DropoutIsZeroAndItsMegatronDefaultIsNamed) {
  expect_issue(with(valid(), {"--attention-dropout", "0.1"}), "--attention-dropout");
  expect_issue(with(valid(), {"--hidden-dropout", "0.05"}), "--hidden-dropout");
  const auto mentions_dropout = [](const RunConfig& config) {
    return std::any_of(config.argument_warnings.begin(), config.argument_warnings.end(),
                       [](const std::string& warning) { return warning.find("dropout") != std::string::npos; });
  };
  EXPECT_TRUE(mentions_dropout(parse(valid())));
  EXPECT_FALSE(mentions_dropout(parse(with(valid(), {"--attention-dropout", "0.0", "--hidden-dropout", "0"}))));
}

TEST(Config, ABrokenRuleSaysWhenItsValueIsADefault) {
  // H 4 is given by valid(); without it the default's check names it as the default.
  const std::string message = expect_issue({"--num-layers", "2", "--hidden-size", "64", "--seq-length", "16",
                                            "--global-batch-size", "4", "--train-samples", "64",
                                            "--tensor-model-parallel-size", "64"},
                                           "--num-attention-heads");
  EXPECT_NE(message.find("the default: not given"), std::string::npos) << message;
}

// Megatron's rules: the deferred weight all-gather belongs to the distributed optimizer and rides
// on the bucketed gradient reduction.
TEST(Config, OverlapParamGatherNeedsTheDistributedOptimizerAndOverlapGradReduce) {
  EXPECT_NE(expect_issue(with(valid(), {"--overlap-param-gather", "--overlap-grad-reduce"}), "--overlap-param-gather")
                .find("add --use-distributed-optimizer"),
            std::string::npos);
  EXPECT_NE(expect_issue(with(valid(), {"--overlap-param-gather", "--use-distributed-optimizer"}), "--overlap-param-gather")
                .find("add --overlap-grad-reduce"),
            std::string::npos);
  expect_issue(with(valid(), {"--ddp-bucket-size", "0"}), "--ddp-bucket-size");
  const RunConfig config = parse(with(valid(), {"--overlap-param-gather", "--overlap-grad-reduce",
                                                "--use-distributed-optimizer", "--ddp-bucket-size", "1000"}));
  EXPECT_TRUE(config.parallel.overlap_param_gather);
  EXPECT_EQ(config.parallel.ddp_bucket_size, 1000);
  EXPECT_EQ(gradient_bucket_parameters(config.parallel), 1000);
}

// Megatron's scheduler asserts warmup < decay for every decay style, and a weight decay that
// only increases.
TEST(Config, WarmupEndsBeforeTheDecaySpanAndWeightDecayOnlyIncreases) {
  expect_issue(with(valid(), {"--lr-warmup-samples", "65"}), "--lr-warmup-samples");
  expect_issue(with(valid(), {"--lr-warmup-samples", "64"}), "--lr-warmup-samples");  // = decay
  expect_issue(with(valid(), {"--lr-warmup-samples", "32", "--lr-decay-samples", "16"}),
               "--lr-warmup-samples");
  expect_issue(with(valid(), {"--lr-warmup-samples", "64", "--lr-decay-style", "constant"}), "--lr-warmup-samples");
  EXPECT_EQ(parse(with(valid(), {"--lr-warmup-samples", "60"})).schedule.lr_warmup_samples, 60);
  expect_issue(with(valid(), {"--weight-decay-incr-style", "linear", "--start-weight-decay", "0.1",
                              "--end-weight-decay", "0.01"}),
               "--end-weight-decay");
  EXPECT_EQ(parse(with(valid(), {"--weight-decay-incr-style", "linear", "--start-weight-decay", "0.01",
                                 "--end-weight-decay", "0.1"}))
                .schedule.end_weight_decay,
            0.1);
}

TEST(Config, MinLrBetweenZeroAndLr) {
  expect_issue(with(valid(), {"--min-lr", "2e-3"}), "--min-lr");
  expect_issue(with(valid(), {"--min-lr", "-1e-5"}), "--min-lr");
}

TEST(Config, BetasInHalfOpenUnitInterval) {
  expect_issue(with(valid(), {"--adam-beta1", "1"}), "--adam-beta1");
  expect_issue(with(valid(), {"--adam-beta2", "-0.1"}), "--adam-beta2");
  EXPECT_NO_THROW(parse(with(valid(), {"--adam-beta1", "0", "--adam-beta2", "0"})));
}

TEST(Config, EpsPositive) { expect_issue(with(valid(), {"--adam-eps", "0"}), "--adam-eps"); }

TEST(Config, TrainSamplesAtLeastOneGlobalBatch) {
  expect_issue(with(valid(), {"--train-samples", "3"}), "--train-samples");
  expect_issue({"--global-batch-size", "4"}, "--train-samples");  // not given at all
}

TEST(Config, SampleAndIterationOptionsNotMixed) {
  expect_issue(with(valid(), {"--lr-warmup-iters", "2"}), "iters");
}

TEST(Config, IterationsConvertToSamples) {
  const RunConfig config = parse({"--global-batch-size", "4", "--train-iters", "10",
                                  "--lr-warmup-iters", "2", "--lr-decay-iters", "8"});
  EXPECT_EQ(config.schedule.train_samples, 10 * 4);
  EXPECT_EQ(config.schedule.lr_warmup_samples, 2 * 4);
  EXPECT_EQ(config.schedule.lr_decay_samples, 8 * 4);
}

TEST(Config, TokenConveniencesRoundAsTheSeed) {
  // 15 tokens per update (gbs 1 x seq 15): 100 tokens -> floor(100/15) = 6 updates;
  // warmup 31 tokens -> ceil(31/15) = 3 updates.
  const RunConfig config = parse({"--global-batch-size", "1", "--seq-length", "15",
                                  "--train-tokens", "100", "--lr-warmup-tokens", "31"});
  EXPECT_EQ(config.schedule.train_samples, 6);
  EXPECT_EQ(config.schedule.lr_warmup_samples, 3);
  expect_issue(with(valid(), {"--train-tokens", "10X"}), "--train-tokens");
}

TEST(Config, TokenConveniencesMustAgreeWithSampleSpansGivenBesideThem) {
  // gbs 1 x seq 15: 100 tokens round down to 6 samples, 31 warmup tokens up to 3 samples.
  const std::vector<std::string> base = {"--global-batch-size", "1", "--seq-length", "15",
                                         "--train-tokens", "100", "--lr-warmup-tokens", "31"};
  const RunConfig agreeing =
      parse(with(base, {"--train-samples", "6", "--lr-warmup-samples", "3"}));
  EXPECT_EQ(agreeing.schedule.train_samples, 6);
  expect_issue(with(base, {"--train-samples", "7"}), "--train-tokens");
  expect_issue(with(base, {"--lr-warmup-samples", "2"}), "--lr-warmup-tokens");
}

TEST(Config, UnsupportedMegatronChoicesAreErrors) {
  expect_issue(with(valid(), {"--normalization", "LayerNorm"}), "--normalization");
  expect_issue(with(valid(), {"--position-embedding-type", "learned_absolute"}),
               "--position-embedding-type");
  expect_issue(with(valid(), {"--optimizer", "sgd"}), "--optimizer");
  expect_issue(with(valid(), {"--fp16"}), "--fp16");
  expect_issue(with(valid(), {"--lr-decay-style", "WSD"}), "--lr-decay-style");
}

TEST(Config, WeightDecayIncrementNeedsBothEnds) {
  expect_issue(with(valid(), {"--weight-decay-incr-style", "linear"}),
               "--weight-decay-incr-style");
  expect_issue(with(valid(), {"--start-weight-decay", "0.1"}), "--start-weight-decay");
  const RunConfig config = parse(with(valid(), {"--weight-decay-incr-style", "cosine",
                                                "--start-weight-decay", "0.0",
                                                "--end-weight-decay", "0.1"}));
  EXPECT_EQ(config.schedule.end_weight_decay, 0.1);
}

TEST(Config, ContradictoryFlags) {
  expect_issue(with(valid(), {"--add-bias-linear", "--disable-bias-linear"}), "--add-bias-linear");
  expect_issue(with(valid(), {"--untie-embeddings-and-output-weights",
                              "--tie-embeddings-and-output-weights"}),
               "--tie-embeddings");
  expect_issue(with(valid(), {"--calculate-per-token-loss", "--loss-normalization",
                              "microbatch-mean"}),
               "--calculate-per-token-loss");
}

TEST(Config, MaskFlagsCanBeTurnedOff) {
  const RunConfig config = parse(with(valid(), {"--no-reset-position-ids",
                                                "--no-reset-attention-mask", "--no-eod-mask-loss"}));
  EXPECT_FALSE(config.data.reset_position_ids);
  EXPECT_FALSE(config.data.reset_attention_mask);
  EXPECT_FALSE(config.data.eod_mask_loss);
}

TEST(Config, SplitIsCheckedWhenParsed) {
  expect_issue(with(valid(), {"--split", "98,x,1"}), "--split");
  EXPECT_NO_THROW(parse(with(valid(), {"--split", "98,1,1"})));
}

TEST(Config, UnknownArgumentIsAnError) {
  EXPECT_THROW(parse(with(valid(), {"--no-such-option", "1"})), CLI::ParseError);
}

TEST(Config, IssuesAreAllReportedAtOnce) {
  try {
    parse(with(valid(), {"--adam-beta1", "2", "--adam-eps", "-1"}));
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.issues().size(), 2u) << error.what();
  }
}

class ConfigFile : public ::testing::Test {
 protected:
  std::filesystem::path path_ =
      std::filesystem::temp_directory_path() / ("tandem_config_test_" +
                                                std::to_string(::getpid()) + ".json");
  void write(const std::string& text) { std::ofstream(path_) << text; }
  void TearDown() override { std::filesystem::remove(path_); }
};

TEST_F(ConfigFile, JsonSuppliesValuesAndArgumentsOverrideThem) {
  write(R"({"global-batch-size": 8, "micro_batch_size": 2, "train-samples": 80,
            "lr": 0.002, "bf16": true, "split": "98,1,1"})");
  const RunConfig from_file = parse({"--config", path_.string()});
  EXPECT_EQ(from_file.batch.global_batch_size, 8);
  EXPECT_EQ(from_file.batch.micro_batch_size, 2);
  EXPECT_EQ(from_file.schedule.lr, 0.002);
  EXPECT_TRUE(from_file.optimizer.bf16);
  const RunConfig overridden = parse({"--config", path_.string(), "--global-batch-size", "4"});
  EXPECT_EQ(overridden.batch.global_batch_size, 4);
}

TEST_F(ConfigFile, UnknownKeyIsAnError) {
  write(R"({"global-batch-size": 8, "not-an-option": 1})");
  EXPECT_NE(expect_issue({"--config", path_.string()}, "--config").find("\"not-an-option\""), std::string::npos);
}

TEST_F(ConfigFile, MalformedJsonAWrongTypeAndAMissingFileAreErrors) {
  write("{\"global-batch-size\": ");
  EXPECT_NE(expect_issue({"--config", path_.string()}, "--config").find("not valid JSON"), std::string::npos);
  write(R"({"global-batch-size": "eight"})");
  EXPECT_NE(expect_issue({"--config", path_.string()}, "--config").find("\"global-batch-size\""), std::string::npos);
  write(R"({"global-batch-size": null})");
  expect_issue({"--config", path_.string()}, "--config");
  EXPECT_NE(expect_issue({"--config", "/nonexistent/tandem.json"}, "--config").find("cannot be opened"),
            std::string::npos);
}

// Through the binary, where each command's options live on a subcommand (the file was never read
// there: `--config` with {"train-iters": 2} failed on train-samples = 0, and a missing file was
// accepted).
TEST_F(ConfigFile, EveryCommandOfTheBinaryReadsItAndTheCommandLineOverridesIt) {
  write(R"({"num-layers": 2, "hidden_size": 32, "num-attention-heads": 4, "seq-length": 16,
            "global-batch-size": 4, "lr": 0.001, "train-iters": 2})");
  const auto plan = testing::run_tandem({"plan", "--config", path_.string(), "--json"}, "", "2>&1");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("\"train_samples\": 8"), std::string::npos) << plan.output;
  const auto overridden = testing::run_tandem({"plan", "--config", path_.string(), "--train-iters", "3", "--json"}, "", "2>&1");
  EXPECT_NE(overridden.output.find("\"train_samples\": 12"), std::string::npos) << overridden.output;
  const auto data = std::filesystem::temp_directory_path() / ("tandem_config_data_" + std::to_string(::getpid()));
  const auto train = testing::run_tandem(
      {"train", "--config", path_.string(), "--device", "cpu", "--quiet", "--data-cache", data.string()}, "", "2>&1");
  std::filesystem::remove_all(data);
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("over 2 iterations"), std::string::npos) << train.output;
  const auto missing = testing::run_tandem({"plan", "--config", "/nonexistent/tandem.json", "--train-iters", "2"}, "", "2>&1");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("--config"), std::string::npos) << missing.output;
  write(R"({"train-iters": "two"})");
  const auto wrong = testing::run_tandem({"plan", "--config", path_.string()}, "", "2>&1");
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("\"train-iters\""), std::string::npos) << wrong.output;
}

// Every rule again through the real binary: the bad input exits 2 with the field on stderr.
TEST(ConfigThroughTheBinary, EveryRuleExitsTwoNamingItsField) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad_inputs = {
      {{"--global-batch-size", "6", "--micro-batch-size", "4"}, "--global-batch-size"},
      {{"--world-size", "3", "--tensor-model-parallel-size", "2"}, "--world-size"},
      {{"--hidden-size", "30"}, "--hidden-size"},
      {{"--group-query-attention", "--num-query-groups", "3"}, "--num-attention-heads"},
      {{"--tensor-model-parallel-size", "8"}, "--num-attention-heads"},
      {{"--num-attention-heads", "6", "--hidden-size", "48", "--group-query-attention", "--num-query-groups", "3",
        "--tensor-model-parallel-size", "2"},
       "--num-query-groups"},
      {{"--num-layers", "3", "--pipeline-model-parallel-size", "2"}, "--num-layers"},
      {{"--ffn-hidden-size", "65", "--tensor-model-parallel-size", "2"}, "--ffn-hidden-size"},
      {{"--attention-dropout", "0.1"}, "--attention-dropout"},
      {{"--overlap-param-gather", "--overlap-grad-reduce"}, "--overlap-param-gather"},
      {{"--lr-warmup-samples", "65"}, "--lr-warmup-samples"},
      {{"--lr", "inf"}, "--lr"},
      {{"--ffn-hidden-size", "4611686018427387904"}, "--ffn-hidden-size"},
      {{"--min-lr", "2e-3"}, "--min-lr"},
      {{"--adam-beta1", "1"}, "--adam-beta1"},
      {{"--adam-beta2", "-0.1"}, "--adam-beta2"},
      {{"--adam-eps", "0"}, "--adam-eps"},
      {{"--train-samples", "3"}, "--train-samples"},
      {{"--lr-warmup-iters", "2"}, "iters"},
      {{"--normalization", "LayerNorm"}, "--normalization"},
      {{"--split", "98,x,1"}, "--split"},
      {{"--no-such-option", "1"}, "--no-such-option"},
  };
  for (const auto& [extra, field] : bad_inputs) {
    std::vector<std::string> arguments = {"plan"};
    for (const auto& argument : with(valid(), extra)) arguments.push_back(argument);
    const auto result = testing::run_tandem(arguments, "", "2>&1");
    EXPECT_EQ(result.exit_code, 2) << field << ":\n" << result.output;
    EXPECT_NE(result.output.find(field), std::string::npos) << field << ":\n" << result.output;
  }
  std::vector<std::string> good = {"plan"};
  for (const auto& argument : valid()) good.push_back(argument);
  EXPECT_EQ(testing::run_tandem(good, "", "2>&1").exit_code, 0);  // the control passes
}

// Found by profiling fuzz_arguments (tests/fuzz): "did you mean" measured the edit distance from an
// unknown option to every option name, in time proportional to both lengths, so ten misspelt
// options of 100,000 characters (1 MB of command line, within Linux's limit) took 3.4 s to refuse
// (RelWithDebInfo). A name whose length differs from the word's by the suggestion's bound or more
// cannot be suggested: it is skipped. What is printed is checked exactly; the time bound, 0.7 s,
// is a fifth of the old time and 35 times the 20 ms the refusal takes now.
TEST(CommandLine, LongMisspeltOptionsAreRefusedAtOnceAndShortOnesStillGetASuggestion) {
  CLI::App app{"tandem", "tandem"};
  CLI::App* plan = app.add_subcommand("plan", "plan");
  RunArguments arguments;
  add_run_options(*plan, arguments);
  std::vector<std::string> words = {"tandem", "plan", "--hiden-size", "64"};
  const std::string long_word = "--" + std::string(100000, 'a');
  for (int i = 0; i < 10; ++i) words.push_back(long_word + std::to_string(i));
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());

  std::ostringstream errors;
  std::streambuf* const saved = std::cerr.rdbuf(errors.rdbuf());
  const auto started = std::chrono::steady_clock::now();
  const std::optional<int> exit_code = parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cerr.rdbuf(saved);

  EXPECT_EQ(exit_code, std::optional<int>(2));
  EXPECT_NE(errors.str().find("--hiden-size: no such option; did you mean --hidden-size?"), std::string::npos);
  EXPECT_NE(errors.str().find(long_word + "9: no such option\n"), std::string::npos);
  EXPECT_LT(seconds, 0.7) << "refusing ten misspelt options of 100,000 characters";
}

// Issue 14's small command-line defects, each through the binary: a single dash before a long
// name printed the help with exit 0; a misspelt option got no suggestion and the stray words came
// in reverse order; `--every 0` printed a 309-digit range; --save naming a file gave a raw
// file-system error; --audit-params beyond the model's parameters was accepted.
TEST(CommandLine, MistakesGetAClearErrorAndExitTwo) {
  const auto plan = [](std::vector<std::string> extra) {
    std::vector<std::string> arguments = {"plan"};
    for (const auto& argument : with(valid(), extra)) arguments.push_back(argument);
    return testing::run_tandem(arguments, "", "2>&1");
  };
  const auto single_dash = plan({"-hidden-size", "64"});
  EXPECT_EQ(single_dash.exit_code, 2) << single_dash.output;
  EXPECT_NE(single_dash.output.find("fix: --hidden-size"), std::string::npos) << single_dash.output;
  const auto misspelt = plan({"--hiden-size", "64", "stray", "words"});
  EXPECT_EQ(misspelt.exit_code, 2) << misspelt.output;
  EXPECT_NE(misspelt.output.find("--hiden-size: no such option; did you mean --hidden-size?"), std::string::npos)
      << misspelt.output;
  EXPECT_NE(misspelt.output.find("belong to no option: 64 stray words"), std::string::npos) << misspelt.output;

  std::vector<std::string> every = {"schedule", "--every", "0"};
  for (const auto& argument : valid()) every.push_back(argument);
  const auto zero = testing::run_tandem(every, "", "2>&1");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find("must be at least 1"), std::string::npos) << zero.output;
  EXPECT_EQ(zero.output.find("179769313486231570814527"), std::string::npos) << zero.output;

  const auto file = std::filesystem::temp_directory_path() / ("tandem_save_file_" + std::to_string(::getpid()));
  std::ofstream(file) << "not a directory";
  const auto save_file = plan({"--save", file.string()});
  std::filesystem::remove(file);
  EXPECT_EQ(save_file.exit_code, 2) << save_file.output;
  EXPECT_NE(save_file.output.find("--save = " + file.string() + ": is a file"), std::string::npos) << save_file.output;

  std::vector<std::string> train = {"train", "--device", "cpu", "--audit-params", "1000000000000"};
  for (const auto& argument : valid()) train.push_back(argument);
  const auto audit = testing::run_tandem(train, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 2) << audit.output;
  EXPECT_NE(audit.output.find("--audit-params = 1000000000000: is more than the model's"), std::string::npos)
      << audit.output;
}

TEST(TokenCount, SuffixesAndRejections) {
  EXPECT_EQ(parse_token_count("10T"), 10e12);
  EXPECT_EQ(parse_token_count("20B"), 20e9);
  EXPECT_EQ(parse_token_count("1.5M"), 1.5e6);
  EXPECT_EQ(parse_token_count("4096"), 4096.0);
  EXPECT_FALSE(parse_token_count("").has_value());
  EXPECT_FALSE(parse_token_count("T").has_value());
  EXPECT_FALSE(parse_token_count("-5B").has_value());
  EXPECT_FALSE(parse_token_count("5X").has_value());
}

}  // namespace
}  // namespace tandem
