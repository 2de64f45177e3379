// Special ids from the tokenizer (SPEC 13; docs/DATA.md section 13; issue 13 part 1): each
// Megatron tokenizer type gives the vocabulary size, EOD and PAD as Megatron takes them; a
// dataset built with GPT-2's vocabulary trains with its own EOD (masks, positions and counters,
// in both engines, through the binary); a resume with other ids, a run that names no tokenizer
// on another tokenizer's data, and every bad tokenizer input are refused naming the option.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/args.hpp"
#include "core/data/indexed_dataset.hpp"
#include "core/data/training_data.hpp"
#include "tests/support/files.hpp"
#include "tests/support/parse_run.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// A valid run of `arguments` (one update of the default 8 samples).
RunConfig parse_run(const std::vector<std::string>& arguments) {
  return testing::parse_run(testing::with({"--train-samples", "8"}, arguments));
}
using testing::read_log;
using testing::run_tandem;
using testing::with;

const fs::path kFixtures = fs::path(TANDEM_SOURCE_DIR) / "fixtures/tokenizers";
const std::string kGpt2Vocab = (kFixtures / "gpt2-tiny/vocab.json").string();
const std::string kGpt2Merges = (kFixtures / "gpt2-tiny/merges.txt").string();
const std::string kHfDir = (kFixtures / "hf-tiny").string();

constexpr std::int32_t kGpt2Eod = 299;  // fixtures/tokenizers/gpt2-tiny: "<|endoftext|>"
constexpr std::int64_t kGpt2Vocab300 = 300;

std::vector<std::string> gpt2() {
  return {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kGpt2Vocab, "--merge-file", kGpt2Merges};
}

// The ConfigError's issue about `field` (the test fails when there is none); its whole message.
std::string issue_about(const std::vector<std::string>& arguments, const std::string& field) {
  try {
    parse_run(arguments);
  } catch (const ConfigError& error) {
    for (const auto& issue : error.issues()) {
      if (issue.field == field) {
        EXPECT_FALSE(issue.rule.empty()) << error.what();
        EXPECT_FALSE(issue.fix.empty()) << error.what();
        return error.what();
      }
    }
    ADD_FAILURE() << "no issue names " << field << ":\n" << error.what();
    return error.what();
  }
  ADD_FAILURE() << "accepted, expected an error naming " << field;
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class TempDirectory {
 public:
  TempDirectory() {
    std::string pattern = (fs::temp_directory_path() / "tandem_tokenizer_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDirectory() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// ---- The ids of each type ---------------------------------------------------------------------

TEST(TokenizerIds, Gpt2TakesEndoftextAsEodTheEntryCountAsVocabularyAndHasNoPad) {
  const RunConfig run = parse_run(gpt2());
  EXPECT_EQ(run.tokenizer.type, TokenizerType::gpt2_bpe);
  EXPECT_EQ(run.model.vocab_size, kGpt2Vocab300);  // len(encoder)
  EXPECT_EQ(run.model.padded_vocab_size, 384);     // 300 rounded up to 128 x TP 1
  EXPECT_EQ(run.tokenizer.eod_token, kGpt2Eod);
  EXPECT_EQ(run.tokenizer.pad_token, kNoPadToken);  // GPTDataset's -1
}

TEST(TokenizerIds, HuggingFaceTakesEosAndPadFromTokenizerConfigAndCountsAddedTokens) {
  const RunConfig run = parse_run({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kHfDir});
  EXPECT_EQ(run.model.vocab_size, 280 + 2);  // 280 model tokens + 2 added (len(tokenizer))
  EXPECT_EQ(run.tokenizer.eod_token, 280);   // eos_token "<|endoftext|>" (an AddedToken object)
  EXPECT_EQ(run.tokenizer.pad_token, 281);   // pad_token "<pad>" (a string)
}

TEST(TokenizerIds, HuggingFaceFallsBackToSpecialTokensMapAndMayHaveNoPad) {
  const TempDirectory dir;
  fs::copy_file(fs::path(kHfDir) / "tokenizer.json", dir.path() / "tokenizer.json");
  write_text(dir.path() / "special_tokens_map.json", R"({"eos_token": "<pad>"})");
  const RunConfig run =
      parse_run({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir.path().string()});
  EXPECT_EQ(run.tokenizer.eod_token, 281);
  EXPECT_EQ(run.tokenizer.pad_token, kNoPadToken);
}

TEST(TokenizerIds, NullTokenizerTakesItsSizeAndEodAtSizeMinusOneAsMegatronCore019) {
  // NullTokenizer(vocab_size, eod_id=None, pad_id=-1): eod = vocab_size - 1 unless given.
  const RunConfig run = parse_run({"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"});
  EXPECT_EQ(run.model.vocab_size, 1000);
  EXPECT_EQ(run.tokenizer.eod_token, 1000 - 1);
  EXPECT_EQ(run.tokenizer.pad_token, kNoPadToken);
  const RunConfig given = parse_run({"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                                     "--null-tokenizer-eod-id", "5", "--null-tokenizer-pad-id", "7"});
  EXPECT_EQ(given.model.vocab_size, 1000);
  EXPECT_EQ(given.tokenizer.eod_token, 5);
  EXPECT_EQ(given.tokenizer.pad_token, 7);
}

TEST(TokenizerIds, APadThatIsTheEodIsNoPad) {
  // MegatronDataset resets a PAD that collides with EOD to -1.
  const RunConfig run = parse_run({"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                                   "--null-tokenizer-pad-id", "999"});
  EXPECT_EQ(run.tokenizer.eod_token, 999);
  EXPECT_EQ(run.tokenizer.pad_token, kNoPadToken);
  const TempDirectory dir;
  fs::copy_file(fs::path(kHfDir) / "tokenizer.json", dir.path() / "tokenizer.json");
  write_text(dir.path() / "tokenizer_config.json", R"({"eos_token": "<pad>", "pad_token": "<pad>"})");
  const RunConfig hf = parse_run({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir.path().string()});
  EXPECT_EQ(hf.tokenizer.eod_token, 281);
  EXPECT_EQ(hf.tokenizer.pad_token, kNoPadToken);
}

TEST(TokenizerIds, NoTokenizerIsTheByteTokenizerAndIsLeftOutOfTheRecordedConfig) {
  const RunConfig run = parse_run({});
  EXPECT_EQ(run.tokenizer.type, TokenizerType::bytes);
  EXPECT_EQ(run.model.vocab_size, kByteVocabularySize);
  EXPECT_EQ(run.tokenizer.eod_token, kEodToken);
  EXPECT_EQ(run.tokenizer.pad_token, kPadToken);
  nlohmann::json recorded;
  to_json(recorded, run);
  EXPECT_FALSE(recorded.contains("tokenizer"));  // logs and checkpoints read as before
  nlohmann::json named;
  to_json(named, parse_run(gpt2()));
  EXPECT_EQ(named.at("tokenizer").at("type"), "GPT2BPETokenizer");
  EXPECT_EQ(named.at("tokenizer").at("eod"), kGpt2Eod);
  EXPECT_TRUE(named.at("tokenizer").at("pad").is_null());
}

// ---- Bad tokenizer input ----------------------------------------------------------------------

TEST(TokenizerErrors, EachNamesTheOptionTheValueAndTheRule) {
  const TempDirectory dir;
  write_text(dir.path() / "no_eod.json", R"({"a": 0, "b": 1})");
  write_text(dir.path() / "gaps.json", R"({"a": 0, "<|endoftext|>": 5})");
  write_text(dir.path() / "broken.json", R"({"a": )");
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "GPT2BPETokenizr"}, "--tokenizer-type"), "GPT2BPETokenizr"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "GPT2BPETokenizer", "--merge-file", kGpt2Merges},
                                   "--vocab-file"), "not given"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kGpt2Vocab},
                                   "--merge-file"), "not given"));
  const std::string missing = (dir.path() / "missing.json").string();
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--vocab-file", missing}), "--vocab-file"), "cannot open"));
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--vocab-file", (dir.path() / "no_eod.json").string()}),
                                   "--vocab-file"), "<|endoftext|>"));
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--vocab-file", (dir.path() / "gaps.json").string()}),
                                   "--vocab-file"), "has id 5"));
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--vocab-file", (dir.path() / "broken.json").string()}),
                                   "--vocab-file"), "not valid JSON"));
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--merge-file", missing}), "--merge-file"), missing));
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--vocab-size", "50257"}), "--vocab-size"), "300 ids"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                    dir.path().string()}, "--tokenizer-model"), "tokenizer.json"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", missing},
                                   "--tokenizer-model"), "not a directory"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "NullTokenizer"}, "--vocab-size"), "not given"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "NullTokenizer", "--vocab-size", "9", "--vocab-file",
                                    kGpt2Vocab}, "--vocab-file"), "GPT2BPETokenizer"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "NullTokenizer", "--vocab-size", "9",
                                    "--null-tokenizer-eod-id", "9"}, "--null-tokenizer-eod-id"), "[0, 9)"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "NullTokenizer", "--vocab-size", "9",
                                    "--null-tokenizer-pad-id", "-2"}, "--null-tokenizer-pad-id"), "-1"));
  EXPECT_TRUE(contains(issue_about(with(gpt2(), {"--null-tokenizer-eod-id", "3"}), "--null-tokenizer-eod-id"),
                       "NullTokenizer"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", "x.model"},
                                   "--tokenizer-model"), "is not a readable file"));
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "SentencePieceTokenizer"}, "--tokenizer-model"),
                       "not given"));
}

TEST(TokenizerErrors, HuggingFaceWithoutEosTokenIsRefused) {
  const TempDirectory dir;
  fs::copy_file(fs::path(kHfDir) / "tokenizer.json", dir.path() / "tokenizer.json");
  write_text(dir.path() / "tokenizer_config.json", R"({"pad_token": "<pad>"})");
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                    dir.path().string()}, "--tokenizer-model"), "eos_token"));
  write_text(dir.path() / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_TRUE(contains(issue_about({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                    dir.path().string()}, "--tokenizer-model"), "</s>"));
}

TEST(TokenizerErrors, AVocabularyOtherThanTheBytesWithoutATokenizerPlansButReadsNoData) {
  // The seed's fragment plans a 128,256-id model without naming its tokenizer (SPEC 10, 11).
  const RunConfig planned = parse_run({"--vocab-size", "50257"});
  EXPECT_EQ(planned.model.vocab_size, 50257);
  const TempDirectory corpus;
  try {
    data::open_training_samples(planned, corpus.path().string());  // the embedded corpus: byte data
    ADD_FAILURE() << "a run naming no tokenizer read data with a vocabulary of 50257";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    ASSERT_EQ(error.issues().size(), 1u) << message;
    EXPECT_EQ(error.issues()[0].field, "--vocab-size");
    EXPECT_TRUE(contains(message, "--vocab-size = 50257")) << message;
    EXPECT_TRUE(contains(message, "without --tokenizer-type")) << message;
    EXPECT_TRUE(contains(message, "--tokenizer-type GPT2BPETokenizer")) << message;  // the fix
  }
  EXPECT_NO_THROW(data::open_training_samples(parse_run({"--vocab-size", "258"}), corpus.path().string()));
}

// ---- A dataset built with GPT-2's vocabulary --------------------------------------------------

// Three documents whose EOD is GPT-2's (299 here), holding 256 and 257 as ordinary tokens: the
// byte tokenizer's EOD and PAD, which main took them for (issue 13: wrong counts, silently).
// Stream (sequential order): doc0 = tokens 0-5 (EOD at 5), doc1 = 6-14 (EOD at 14), doc2 =
// 15-34 (EOD at 34); 35 tokens per epoch.
const std::vector<std::vector<std::int32_t>> kGpt2Documents = {
    {5, 256, 7, 257, 9},
    {256, 256, 257, 11, 12, 13, 14, 15},
    {257, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37},
};

std::string write_gpt2_dataset(const fs::path& directory) {
  data::IndexedDatasetWriterConfig config;
  config.prefix = (directory / "gpt2").string();
  config.vocab_size = kGpt2Vocab300;
  config.eod_token = kGpt2Eod;  // appended to each document, as preprocess_data.py --append-eod
  data::IndexedDatasetWriter writer(config);
  for (const auto& document : kGpt2Documents) writer.add_document(document);
  writer.finish();
  return config.prefix;
}

std::vector<std::int32_t> range_from(std::int32_t first, std::int32_t count) {
  std::vector<std::int32_t> out;
  for (std::int32_t i = 0; i < count; ++i) out.push_back(first + i);
  return out;
}
std::vector<std::int32_t> concatenated(std::initializer_list<std::vector<std::int32_t>> parts) {
  std::vector<std::int32_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(Gpt2Dataset, SamplesTakeTheirMasksPositionsAndCountsFromTheTokenizersEod) {
  const TempDirectory dir;
  const std::string prefix = write_gpt2_dataset(dir.path());
  const RunConfig run = parse_run(with(gpt2(), {"--data-path", prefix, "--seq-length", "16", "--data-order",
                                                "sequential"}));
  const auto samples = data::open_training_samples(run);

  // Sample 0: inputs = stream 0-15, EOD inputs at t = 5 and 14; documents start at 0, 6, 15.
  const Sample first = samples->sample(0);
  EXPECT_EQ(first.input_tokens, 16);
  EXPECT_EQ(first.pad_tokens, 0);
  EXPECT_EQ(first.loss_tokens, 16 - 2);  // no loss where the input is EOD
  EXPECT_EQ(first.positions, concatenated({range_from(0, 6), range_from(0, 9), {0}}));
  EXPECT_EQ(first.attention_start,
            concatenated({std::vector<std::int32_t>(6, 0), std::vector<std::int32_t>(9, 6), {15}}));
  std::vector<std::uint8_t> loss_mask(16, 1);
  loss_mask[5] = loss_mask[14] = 0;
  EXPECT_EQ(first.loss_mask, loss_mask);
  EXPECT_EQ(first.labels[4], kGpt2Eod);  // the EOD is learned as a target
  EXPECT_EQ(first.loss_mask[4], 1);

  // Sample 1: inputs = stream 16-31, inside doc2 (begun in the previous window): no boundary.
  const Sample second = samples->sample(1);
  EXPECT_EQ(second.input_tokens, 16);
  EXPECT_EQ(second.loss_tokens, 16);
  EXPECT_EQ(second.positions, range_from(0, 16));
  EXPECT_EQ(second.attention_start, std::vector<std::int32_t>(16, 0));
}

TEST(Gpt2Dataset, UnitPackingWithoutAPadTokenPadsWithTokenZeroMasked) {
  const TempDirectory dir;
  const std::string prefix = write_gpt2_dataset(dir.path());
  const RunConfig run = parse_run(with(gpt2(), {"--data-path", prefix, "--seq-length", "16", "--data-order",
                                                "sequential", "--packing", "units"}));
  // Window 0 (17 slots): doc0 (6) + doc1 (9) = 15 tokens, doc2 (20) does not fit: 2 padding slots.
  const Sample sample = data::open_training_samples(run)->sample(0);
  EXPECT_EQ(sample.input_tokens, 15);
  EXPECT_EQ(sample.pad_tokens, 1);
  EXPECT_EQ(sample.loss_tokens, 16 - 3);  // EOD inputs at 5 and 14, padding at 15
  EXPECT_EQ(sample.tokens[15], 0);        // Megatron's GPTDataset: padding (-1) reads as 0
  EXPECT_EQ(sample.labels[14], 0);
  EXPECT_EQ(sample.labels[15], 0);
  EXPECT_EQ(sample.attention_start[15], 15);
}

TEST(Gpt2Dataset, BlendsAndTheValidationSplitTakeTheTokenizersIdsToo) {
  const TempDirectory dir;
  const std::string prefix = write_gpt2_dataset(dir.path());
  // --split 1,2 on 3 sequences: train [0, 1) = doc0, valid [1, 3) = doc1 and doc2.
  const RunConfig run = parse_run(with(gpt2(), {"--data-path", "0.5", prefix, "0.5", prefix, "--seq-length", "16",
                                                "--data-order", "sequential", "--split", "1,2"}));
  // Train: doc0 (6 tokens, EOD last) repeated across epochs; EOD inputs at t = 5 and 11.
  const Sample train = data::open_training_samples(run)->sample(0);
  EXPECT_EQ(train.loss_tokens, 16 - 2);
  EXPECT_EQ(train.pad_tokens, 0);
  EXPECT_EQ(train.positions, concatenated({range_from(0, 6), range_from(0, 6), range_from(0, 4)}));
  // Valid: doc1 (9 tokens, EOD at 8) then doc2; one EOD input.
  const auto valid = data::open_training_samples_at(data::resolve_data_path(run), run, data::DatasetSplit::valid);
  const Sample first = valid->sample(0);
  EXPECT_EQ(first.loss_tokens, 16 - 1);
  EXPECT_EQ(first.pad_tokens, 0);
  EXPECT_EQ(first.positions, concatenated({range_from(0, 9), range_from(0, 7)}));
}

TEST(Gpt2Dataset, ARunNamingNoTokenizerRefusesItBeforeTrainingNamingTheOption) {
  const TempDirectory dir;
  const std::string prefix = write_gpt2_dataset(dir.path());
  const RunConfig run = parse_run({"--data-path", prefix, "--seq-length", "16"});
  try {
    data::open_training_samples(run);
    ADD_FAILURE() << "the byte tokenizer's run opened GPT-2 data";
  } catch (const data::DatasetError& error) {
    const std::string message = error.what();
    EXPECT_TRUE(contains(message, "token 299")) << message;  // doc0's EOD, the first token >= 258
    EXPECT_TRUE(contains(message, "--tokenizer-type")) << message;
  }
}

// ---- Through the binary -----------------------------------------------------------------------

class TokenizerCli : public testing::TinyTrainCli {
 protected:
  std::string prefix_;
  void SetUp() override {
    TinyTrainCli::SetUp();
    prefix_ = write_gpt2_dataset(root_);
  }
  // 2 iterations of 2 samples x 16 tokens on the GPT-2 dataset, in dataset order.
  std::vector<std::string> train(const std::vector<std::string>& engine, const std::vector<std::string>& tokenizer,
                                 const std::vector<std::string>& extra) const {
    std::vector<std::string> arguments = {"train"};
    arguments.insert(arguments.end(), engine.begin(), engine.end());
    const std::vector<std::string> run = {
        "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "1", "--global-batch-size", "2", "--train-samples", "4", "--lr", "1e-3",
        "--data-order", "sequential", "--data-path", prefix_, "--quiet"};
    for (const auto* part : {&run, &tokenizer, &extra}) arguments.insert(arguments.end(), part->begin(), part->end());
    return arguments;
  }
};

TEST_F(TokenizerCli, BothEnginesTrainAGpt2DatasetWithItsEodAndTheRightCounts) {
  // Iteration 1: samples 0-1 (stream 0-32), EOD inputs at 5 and 14: 32 inputs, 30 loss tokens.
  // Iteration 2: samples 2-3 (stream 32-64; epoch 2 starts at 35): EOD inputs at 34, 40, 49.
  const std::vector<std::int64_t> loss_tokens = {32 - 2, 32 - 3};
  std::vector<std::vector<nlohmann::json>> logs;
  for (const std::vector<std::string>& engine : {std::vector<std::string>{"--engine", "reference"},
                                                 std::vector<std::string>{"--engine", "production", "--device", "cpu"}}) {
    const auto log = root_ / (engine[1] + ".jsonl");
    const auto result = run_tandem(train(engine, gpt2(), {"--log", log.string()}), "", "2>&1");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    std::vector<nlohmann::json> records;  // the header, then the iteration records
    for (auto& record : read_log(log)) {
      if (record.at("type") == "header" || record.at("type") == "iteration") records.push_back(std::move(record));
    }
    ASSERT_EQ(records.size(), 3u) << engine[1];
    ASSERT_EQ(records[0].at("type"), "header");
    const auto& tokenizer = records[0].at("config").at("tokenizer");
    EXPECT_EQ(tokenizer.at("type"), "GPT2BPETokenizer");
    EXPECT_EQ(tokenizer.at("eod"), kGpt2Eod);
    EXPECT_TRUE(tokenizer.at("pad").is_null());
    EXPECT_EQ(tokenizer.at("vocab_size"), kGpt2Vocab300);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto& record = records[i + 1];
      EXPECT_EQ(record.at("input_tokens"), 32) << engine[1] << " iteration " << i + 1;
      EXPECT_EQ(record.at("pad_tokens"), 0) << engine[1] << " iteration " << i + 1;
      EXPECT_EQ(record.at("loss_tokens"), loss_tokens[i]) << engine[1] << " iteration " << i + 1;
    }
    logs.push_back(records);
  }
  for (std::size_t i = 1; i < 3; ++i) {
    for (const char* key : {"input_tokens", "loss_tokens", "pad_tokens", "consumed_samples"}) {
      EXPECT_EQ(logs[0][i].at(key), logs[1][i].at(key)) << key << " at iteration " << i;
    }
  }
}

TEST_F(TokenizerCli, AResumeWithOtherIdsIsRefusedWithExit2) {
  const auto save = root_ / "save";
  const auto first = run_tandem(train({"--engine", "reference"}, gpt2(), {"--save", save.string(), "--exit-interval", "1"}),
                                "", "2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // The same 300 ids with "<|endoftext|>" at 0: only the EOD differs.
  const auto vocab = root_ / "vocab.json";
  {
    nlohmann::json swapped = nlohmann::json::parse(testing::bytes_of(kGpt2Vocab));
    swapped["t0"] = kGpt2Eod;
    swapped["<|endoftext|>"] = 0;
    std::ofstream(vocab) << swapped.dump();
  }
  const auto other = run_tandem(train({"--engine", "reference"},
                                      {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab.string(),
                                       "--merge-file", kGpt2Merges},
                                      {"--save", save.string(), "--load", save.string()}),
                                "", "2>&1");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_TRUE(contains(other.output, "--tokenizer-type")) << other.output;
  EXPECT_TRUE(contains(other.output, "EOD 0")) << other.output;
  EXPECT_TRUE(contains(other.output, "EOD 299")) << other.output;
  EXPECT_TRUE(contains(other.output, "--vocab-file " + kGpt2Vocab)) << other.output;  // the fix
  // The same ids from another type (NullTokenizer 300: 300 ids, EOD 299, no PAD) resume.
  const auto same = run_tandem(train({"--engine", "reference"}, {"--tokenizer-type", "NullTokenizer", "--vocab-size", "300"},
                                     {"--save", save.string(), "--load", save.string()}),
                               "", "2>&1");
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

TEST_F(TokenizerCli, ACheckpointWithoutTokenizerIsTheByteTokenizers) {
  // A byte-tokenizer run records no tokenizer (as every checkpoint before it); resuming it with
  // NullTokenizer 258 (258 ids, EOD 257, no PAD) changes EOD 256 -> 257 and PAD 257 -> none.
  const auto save = root_ / "bytes";
  const std::vector<std::string> bytes_run = {
      "train", "--engine", "reference", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
      "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-samples", "4",
      "--data-cache", (root_ / "corpus").string(), "--quiet", "--save", save.string()};
  const auto first = run_tandem(with(bytes_run, {"--exit-interval", "1"}), "", "2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto resumed = run_tandem(
      with(bytes_run, {"--load", save.string(), "--tokenizer-type", "NullTokenizer", "--vocab-size", "258"}), "", "2>&1");
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "EOD 256, PAD 257")) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "no --tokenizer-type")) << resumed.output;
}

TEST_F(TokenizerCli, AVocabularySizeWithoutATokenizerExits2BeforeTraining) {
  const auto result = run_tandem(train({"--engine", "reference"}, {"--vocab-size", "300"}, {}), "", "2>&1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "error: --vocab-size = 300")) << result.output;
  EXPECT_TRUE(contains(result.output, "--tokenizer-type")) << result.output;
}

TEST_F(TokenizerCli, TheByteTokenizerOnGpt2DataStopsBeforeTheFirstIteration) {
  const auto log = root_ / "log.jsonl";
  const auto result = run_tandem(train({"--engine", "reference"}, {}, {"--log", log.string()}), "", "2>&1");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "--tokenizer-type")) << result.output;
  EXPECT_FALSE(fs::exists(log) && contains(testing::bytes_of(log), "\"type\":\"iteration\"")) << result.output;
}

}  // namespace
}  // namespace tandem
