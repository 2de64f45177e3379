// Blended datasets (core/data/blend.hpp, docs/DATA.md section 9): how --data-path's values parse
// (each bad form refused naming the field, the value, the rule and the fix), Megatron's blending
// rule against sequences derived by hand, its bounds at every prefix of the stream as a
// RapidCheck property, and TrainingSamples reading each blend sample from the dataset the index
// names, into that dataset's later epochs. Every comparison is exact.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "core/args.hpp"
#include "core/data/blend.hpp"
#include "core/data/indexed_dataset.hpp"
#include "core/data/training_data.hpp"
#include "tests/support/parse_run.hpp"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using Strings = std::vector<std::string>;

// ---- Parsing --data-path ----------------------------------------------------------------------

TEST(DataPathParse, NoValueIsTheEmbeddedCorpusAndOneValueIsOnePrefix) {
  EXPECT_TRUE(parse_data_path({}).empty());
  const auto one = parse_data_path({"/data/web"});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].prefix, "/data/web");
  EXPECT_FALSE(one[0].weight.has_value());
}

TEST(DataPathParse, WeightPrefixPairsAreABlendWithNormalizedWeights) {
  const auto blend = parse_data_path({"1", "/data/web", "3", "/data/code"});
  ASSERT_EQ(blend.size(), 2u);
  EXPECT_EQ(blend[0].prefix, "/data/web");
  EXPECT_EQ(blend[1].prefix, "/data/code");
  EXPECT_EQ(*blend[0].weight, 1.0 / 4.0);
  EXPECT_EQ(*blend[1].weight, 3.0 / 4.0);
  // Megatron's own example: 30 and 70 become 30/100 and 70/100.
  const auto megatron = parse_data_path({"30", "/a", "70", "/b"});
  EXPECT_EQ(*megatron[0].weight, 30.0 / 100.0);
  EXPECT_EQ(*megatron[1].weight, 70.0 / 100.0);
  // One pair: a blend of one, weight 1.
  const auto single = parse_data_path({"0.25", "/a"});
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(*single[0].weight, 1.0);
}

TEST(DataPathParse, PrefixesWithoutWeightsAreMegatronsSizeWeightedBlend) {
  for (const Strings& values : {Strings{"/a", "/b"}, Strings{"/a", "/b", "/c"}}) {
    const auto blend = parse_data_path(values);
    ASSERT_EQ(blend.size(), values.size());
    for (std::size_t d = 0; d < values.size(); ++d) {
      EXPECT_EQ(blend[d].prefix, values[d]);
      EXPECT_FALSE(blend[d].weight.has_value());  // fixed when the datasets open
    }
  }
  // Megatron strips the prefixes.
  EXPECT_EQ(parse_data_path({"2", " /a "})[0].prefix, "/a");
}

// The first issue a bad --data-path raises, through build_run_config as every subcommand runs it.
ConfigIssue first_issue(const Strings& values) {
  Strings arguments = {"--train-samples", "8", "--data-path"};
  arguments.insert(arguments.end(), values.begin(), values.end());
  try {
    testing::parse_run(arguments);
  } catch (const ConfigError& error) {
    if (!error.issues().empty()) return error.issues().front();
  }
  ADD_FAILURE() << "accepted --data-path " << ::testing::PrintToString(values);
  return {};
}

struct BadForm {
  const char* name;
  Strings values;
  const char* value;  // what the error must show
  const char* rule;   // a phrase of the rule it must state
};

TEST(DataPathParse, EveryBadFormIsAnErrorNamingFieldValueRuleAndFix) {
  const std::vector<BadForm> forms = {
      {"odd count with weights", {"0.3", "/a", "0.7"}, "0.3 /a 0.7", "its count is even"},
      {"a prefix where a weight belongs", {"0.3", "/a", "/b", "/c"}, "/b", "where a weight belongs"},
      {"weights after their prefixes", {"/a", "0.3", "/b", "0.7"}, "/a", "where a weight belongs"},
      {"a weight where a prefix belongs", {"0.3", "0.7", "0.5", "/b"}, "0.7", "where a prefix belongs"},
      {"zero weight", {"0", "/a", "1", "/b"}, "0", "finite number > 0"},
      {"negative weight", {"1", "/a", "-1", "/b"}, "-1", "finite number > 0"},
      {"infinite weight", {"inf", "/a", "1", "/b"}, "inf", "finite number > 0"},
      {"NaN weight", {"nan", "/a", "1", "/b"}, "nan", "finite number > 0"},
      {"a lone weight", {"0.5"}, "0.5", "a weight without its prefix"},
      {"an empty prefix", {"1", "", "1", "/b"}, "\"\"", "empty prefix"},
  };
  for (const auto& form : forms) {
    SCOPED_TRACE(form.name);
    const ConfigIssue issue = first_issue(form.values);
    EXPECT_EQ(issue.field, "--data-path");
    EXPECT_EQ(issue.value, form.value);
    EXPECT_NE(issue.rule.find(form.rule), std::string::npos) << issue.rule;
    EXPECT_FALSE(issue.fix.empty());
  }
}

TEST(DataPathParse, TheConfigRecordsTheBlend) {
  const RunConfig run =
      testing::parse_run({"--train-samples", "8", "--data-path", "1", "/a", "3", "/b"});
  ASSERT_EQ(run.data.data_path.size(), 2u);
  EXPECT_EQ(run.data.data_path[1], (DataPathEntry{"/b", 3.0 / 4.0}));
}

// ---- The blending index against sequences derived by hand -------------------------------------

// The first `count` choices: the datasets as one digit each, and their dataset samples.
std::string datasets_of(const BlendingIndex& index, std::int64_t count) {
  std::string digits;
  for (std::int64_t i = 0; i < count; ++i) digits += std::to_string(index.at(i).dataset);
  return digits;
}
std::vector<std::int64_t> dataset_samples_of(const BlendingIndex& index, std::int64_t count) {
  std::vector<std::int64_t> samples;
  for (std::int64_t i = 0; i < count; ++i) samples.push_back(index.at(i).dataset_sample);
  return samples;
}

TEST(BlendingIndex, ThirtySeventyOverTheFirstTwentySamples) {
  // e_d = w_d max(i,1) - c_d. i=0: 0.3, 0.7 -> 1. i=1 (target still 1): 0.3, -0.3 -> 0.
  // i=2: 0.6-1, 1.4-1 -> 1. i=3: 0.9-1, 2.1-2 -> 1. i=4: 1.2-1, 2.8-3 -> 0. ...
  const BlendingIndex index(normalize_weights({0.3, 0.7}));
  EXPECT_EQ(datasets_of(index, 20), "10110110110111011011");
  EXPECT_EQ(dataset_samples_of(index, 20),
            (std::vector<std::int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7, 8, 9, 4, 10, 11, 5, 12, 13}));
}

TEST(BlendingIndex, ThreeDatasets) {
  // 0.2/0.3/0.5. i=0: 0.2, 0.3, 0.5 -> 2. i=1: 0.2, 0.3, -0.5 -> 1. i=2: 0.4, -0.4, 0 -> 0.
  const BlendingIndex index(normalize_weights({0.2, 0.3, 0.5}));
  EXPECT_EQ(datasets_of(index, 20), "21021202120212120212");
}

TEST(BlendingIndex, EqualErrorsGoToTheLowerDataset) {
  // Equal weights: every round the errors tie and the lowest dataset not yet taken wins.
  EXPECT_EQ(datasets_of(BlendingIndex(normalize_weights({1, 1, 1})), 12), "012012012012");
  EXPECT_EQ(datasets_of(BlendingIndex(normalize_weights({1, 1})), 8), "01010101");
}

TEST(BlendingIndex, ADominantWeightTakesAlmostEverySample) {
  // 1/100 vs 99/100: dataset 0's error 0.01 max(i,1) - c_0 beats dataset 1's at i = 1 (0.01 vs
  // -0.01), then not until i = 100, where both errors are exactly 0 (0.01 x 100 and 0.99 x 100
  // round to 1 and 99) and the tie goes to the lower dataset; the next is i = 200.
  const BlendingIndex index(normalize_weights({1, 99}));
  EXPECT_EQ(datasets_of(index, 12), "101111111111");
  for (std::int64_t i = 2; i < 100; ++i) EXPECT_EQ(index.at(i).dataset, 1) << "sample " << i;
  EXPECT_EQ(index.at(100), (BlendPosition{0, 1}));
  for (std::int64_t i = 101; i < 200; ++i) EXPECT_EQ(index.at(i).dataset, 1) << "sample " << i;
  EXPECT_EQ(index.at(200), (BlendPosition{0, 2}));
  EXPECT_EQ(datasets_of(BlendingIndex(normalize_weights({0.9, 0.1})), 20), "01000000000100000000");
}

TEST(BlendingIndex, MegatronsTargetLagsOneSampleSoADatasetCanFallMoreThanOneBehind) {
  // 1/11, 1/11, 9/11 (exact fractions: e_d x 11). i=0 (target 1): 1, 1, 9 -> 2. i=1 (target 1):
  // 1, 1, -2 -> 0 (tie with 1). i=2: -9, 2, 7 -> 2. i=3: -8, 3, 5 -> 2. i=4: -7, 4, 3 -> 1.
  // After 5 samples dataset 2 holds 3 of its 45/11 share: 12/11 of a sample behind.
  const BlendingIndex index(normalize_weights({1, 1, 9}));
  EXPECT_EQ(datasets_of(index, 5), "20221");
}

TEST(BlendingIndex, OneDatasetIsThatDataset) {
  const BlendingIndex index({1.0});
  for (std::int64_t i : {0, 1, 7, 100000}) EXPECT_EQ(index.at(i), (BlendPosition{0, i}));
}

TEST(BlendingIndex, LookupsInAnyOrderAgreeWithOneWalk) {
  // The saved counts (every kCountStride samples) must not change any answer: a fresh index
  // asked far ahead first, then backwards, agrees with a walk from sample 0.
  const std::vector<double> weights = normalize_weights({0.2, 0.3, 0.5});
  const std::int64_t count = 3 * BlendingIndex::kCountStride + 17;
  const BlendingIndex walked(weights);
  std::vector<BlendPosition> expected;
  for (std::int64_t i = 0; i < count; ++i) expected.push_back(walked.at(i));
  const BlendingIndex jumped(weights);
  for (std::int64_t i = count - 1; i >= 0; i -= 97) {
    EXPECT_EQ(jumped.at(i), expected[static_cast<std::size_t>(i)]) << "sample " << i;
  }
  EXPECT_THROW(jumped.at(-1), std::out_of_range);
}

// Weights drawn as 1 .. 1000 (any positive ratio), 2 to 6 datasets.
rc::Gen<std::vector<double>> blend_weights() {
  return rc::gen::mapcat(rc::gen::inRange<std::size_t>(2, 7), [](std::size_t datasets) {
    return rc::gen::container<std::vector<double>>(
        datasets, rc::gen::map(rc::gen::inRange(1, 1001), [](int w) { return double(w); }));
  });
}

RC_GTEST_PROP(BlendingIndexProperty,
              NoDatasetGetsAWholeSampleAheadOfItsShareAndTwoDatasetsStayWithinOne, ()) {
  const std::vector<double> weights = normalize_weights(*blend_weights());
  const BlendingIndex index(weights);
  const auto datasets = static_cast<double>(weights.size());
  std::vector<std::int64_t> taken(weights.size(), 0);
  for (std::int64_t n = 1; n <= 2000; ++n) {
    const BlendPosition at = index.at(n - 1);
    auto& count = taken[static_cast<std::size_t>(at.dataset)];
    RC_ASSERT(at.dataset_sample == count);  // each dataset's samples in order, none skipped
    ++count;
    for (std::size_t d = 0; d < weights.size(); ++d) {
      const double ahead = static_cast<double>(taken[d]) - weights[d] * static_cast<double>(n);
      // A dataset is taken only when its error is the largest, hence >= 0 (the errors sum to
      // 0): after it, it is at most 1 - w_d ahead. The errors summing to 0 bound how far one
      // falls behind by the others' lead: < K - 1; with two datasets, < 1.
      RC_ASSERT(ahead < 1.0);
      RC_ASSERT(-ahead < datasets - 1.0);
    }
  }
}

// ---- TrainingSamples over real datasets -------------------------------------------------------

// Two small datasets in a temporary directory: "a" of 3 documents, "b" of 5.
class TwoDatasets : public ::testing::Test {
 protected:
  std::string directory_;
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_blend_XXXXXX").string();
    directory_ = ::mkdtemp(pattern.data());
    write("a", {{1, 2, 3, 4, 5, 6, 7}, {8, 9, 10}, {11, 12, 13, 14, 15}});
    write("b", {{101, 102}, {103, 104, 105, 106}, {107}, {108, 109, 110, 111, 112, 113}, {114, 115}});
  }
  void TearDown() override { fs::remove_all(directory_); }
  void write(const std::string& name, const std::vector<std::vector<std::int32_t>>& documents) {
    IndexedDatasetWriterConfig config;
    config.prefix = directory_ + "/" + name;
    IndexedDatasetWriter writer(config);
    for (const auto& document : documents) writer.add_document(document);
    writer.finish();
  }
  std::string prefix(const std::string& name) const { return directory_ + "/" + name; }
  RunConfig run(const Strings& data_path) const {
    Strings arguments = {"--seq-length", "4", "--train-samples", "8", "--data-path"};
    arguments.insert(arguments.end(), data_path.begin(), data_path.end());
    return testing::parse_run(arguments);
  }
};

TEST_F(TwoDatasets, EachBlendSampleIsTheNamedDatasetsSampleIntoItsLaterEpochs) {
  const RunConfig config = run({"1", prefix("a"), "3", prefix("b")});
  const auto blend = open_training_samples(config);
  const auto a = open_training_samples(run({prefix("a")}));
  const auto b = open_training_samples(run({prefix("b")}));
  ASSERT_EQ(blend->datasets().size(), 2u);
  EXPECT_EQ(blend->datasets()[0].weight, 1.0 / 4.0);
  // a holds 18 tokens (EODs included), 4 windows of 4 per epoch; 200 blend samples take 50 of
  // them, 12 epochs' worth: the dataset never runs dry.
  const std::int64_t count = 200;
  std::vector<std::int64_t> taken(2, 0);
  for (std::int64_t i = 0; i < count; ++i) {
    const BlendPosition at = blend->position(i);
    EXPECT_EQ(at.dataset_sample, taken[static_cast<std::size_t>(at.dataset)]++);
    const auto& own = at.dataset == 0 ? *a : *b;
    const Sample blended = blend->sample(i);
    const Sample direct = own.sample(at.dataset_sample);
    EXPECT_EQ(blended.global_index, i);
    EXPECT_EQ(blended.tokens, direct.tokens) << "sample " << i;
    EXPECT_EQ(blended.labels, direct.labels) << "sample " << i;
    EXPECT_EQ(blended.loss_mask, direct.loss_mask) << "sample " << i;
    EXPECT_EQ(blended.positions, direct.positions) << "sample " << i;
    EXPECT_EQ(blend->window_tokens(i), own.window_tokens(at.dataset_sample));
  }
  EXPECT_EQ(taken[0], count / 4);  // 1/4 of 200, exactly, at this prefix
  EXPECT_GT(taken[0], 3 * a->datasets()[0].samples->samples_per_epoch());
  EXPECT_NE(blend->summary().find("0.25 x " + prefix("a")), std::string::npos) << blend->summary();
}

TEST_F(TwoDatasets, PrefixesWithoutWeightsWeighEachBySamplesPerEpoch) {
  const auto blend = open_training_samples(run({prefix("a"), prefix("b")}));
  // Megatron's one-epoch length floor((E - 1) / L): a has 18 tokens -> 4; b has 20 -> 4.
  ASSERT_TRUE(blend->weights_from_sizes());
  EXPECT_EQ(megatron_samples_per_epoch(*blend->datasets()[0].samples), (18 - 1) / 4);
  EXPECT_EQ(megatron_samples_per_epoch(*blend->datasets()[1].samples), (20 - 1) / 4);
  EXPECT_EQ(blend->datasets()[0].weight, 4.0 / 8.0);
  EXPECT_EQ(blend->datasets()[1].weight, 4.0 / 8.0);
}

TEST_F(TwoDatasets, TheSplitAppliesToEachDataset) {
  // --split 1,1: a trains on sequences [0, 2) (1.5 rounds to 2), b on [0, 2) (2.5 rounds to 2).
  RunConfig config = run({"1", prefix("a"), "1", prefix("b")});
  config.data.split = "1,1";
  const auto blend = open_training_samples(config);
  EXPECT_EQ(blend->datasets()[0].samples->sequence_range(), (SequenceRange{0, 2}));
  EXPECT_EQ(blend->datasets()[1].samples->sequence_range(), (SequenceRange{0, 2}));
}

TEST_F(TwoDatasets, AMissingDatasetIsAnErrorNamingIt) {
  const RunConfig config = run({"1", prefix("a"), "1", prefix("missing")});
  try {
    open_training_samples(config);
    FAIL() << "opened a blend with a missing dataset";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find(prefix("missing")), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tandem::data
