// `tandem data inspect` through the real binary (issue 13 part 5; docs/DATA.md section 14): golden
// text of samples of a three-document corpus built here, whose every column is derived below
// from SPEC 3; the masks printed are the trainers' own (a flag the trainers read changes them).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/data/indexed_dataset.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::run_tandem;

// Documents "ab", "c\n", "é" (UTF-8 c3 a9): with the byte tokenizer's EOD (256) appended, the
// stream is  a b EOD c \n EOD c3 a9 EOD  (9 tokens, E = 9), epoch after epoch in
// --data-order sequential.
class DataInspect : public ::testing::Test {
 protected:
  std::filesystem::path root_;
  std::string prefix_;

  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("tandem-inspect-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    {
      std::ofstream docs(root_ / "docs.jsonl");
      for (const char* text : {"ab", "c\n", "\xc3\xa9"}) docs << nlohmann::json{{"text", text}}.dump() << "\n";
    }
    prefix_ = (root_ / "docs_text_document").string();  // preprocess_data.py's name for key "text"
    const auto built = run_tandem({"data", "build", "--input", (root_ / "docs.jsonl").string(),
                                   "--output-prefix", (root_ / "docs").string()}, "", "2>&1");
    ASSERT_EQ(built.exit_code, 0) << built.output;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // The output with the temporary prefix replaced by "PREFIX".
  std::string inspect(std::vector<std::string> extra, int expected_exit = 0) const {
    std::vector<std::string> arguments = {"data", "inspect", prefix_, "--seq-length", "6",
                                          "--data-order", "sequential", "--train-samples", "8"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    const auto result = run_tandem(arguments, "", "2>&1");
    EXPECT_EQ(result.exit_code, expected_exit) << result.output;
    std::string text = result.output;
    for (std::size_t at; (at = text.find(prefix_)) != std::string::npos;) text.replace(at, prefix_.size(), "PREFIX");
    return text;
  }
};

// Sample 1 is window 1 of concat packing: stream tokens [6, 13) = c3 a9 EOD | a b EOD | c.
// positions restart after each EOD, the EOD keeping its document's (0 1 2 | 0 1 2); attention
// starts at the document's first slot (0 0 0 | 3 3 3); the loss is off only where the input is
// the EOD (slot 5: its label "c" begins the next document); the EOD labels (slots 1, 4) learn it.
TEST_F(DataInspect, ASampleShowsItsDocumentsPositionsAttentionAndLossMask) {
  const std::string expected =
      "sample 1 of PREFIX, train part, --data-order sequential, --packing concat\n"
      "tokenizer: bytes (tandem's byte tokenizer): EOD 256, PAD 257, 258 ids; ids below 256 are UTF-8 bytes, shown as text\n"
      "window: 7 tokens = 6 inputs + the last label\n"
      "masks (SPEC 3): --reset-position-ids on, --reset-attention-mask on, --eod-mask-loss on\n"
      "counts: 6 input tokens, 4 loss tokens, 0 pad tokens\n"
      "\n"
      "documents (window slots; a document cut by the window's edge continues in another sample):\n"
      "  doc 0  slots 0..2  \"\xc3\xa9\" <EOD>\n"
      "  doc 1  slots 3..5  \"ab\" <EOD>\n"
      "  doc 2  slots 6..6  \"c\"\n"
      "\n"
      "slot  doc  input         label         loss  position  attends  note\n"
      "0     0    195 '\\xc3'    169 '\\xa9'    1     0         0..0\n"
      "1     0    169 '\\xa9'    256 <EOD>     1     1         0..1     learns the EOD\n"
      "2     0    256 <EOD>     97 'a'        0     2         0..2     input is EOD: the label starts another document, not learned\n"
      "3     1    97 'a'        98 'b'        1     0         3..3\n"
      "4     1    98 'b'        256 <EOD>     1     1         3..4     learns the EOD\n"
      "5     1    256 <EOD>     99 'c'        0     2         3..5     input is EOD: the label starts another document, not learned\n";
  EXPECT_EQ(inspect({"--sample", "1"}), expected);
}

// Unit packing (docs/DATA.md section 6, 7 slots a window): window 0 holds "ab" EOD and "c\n" EOD
// and one PAD ("é" EOD does not fit); window 1 = c3 a9 EOD and 4 PAD closing the epoch. Padding
// attends only to itself (3..3), its positions keep counting from the EOD's restart (0 1 2), and
// neither padding inputs nor the EOD whose label is padding are learned.
TEST_F(DataInspect, PaddingIsShownAndNotLearned) {
  const std::string expected =
      "sample 1 of PREFIX, train part, --data-order sequential, --packing units\n"
      "tokenizer: bytes (tandem's byte tokenizer): EOD 256, PAD 257, 258 ids; ids below 256 are UTF-8 bytes, shown as text\n"
      "window: 7 tokens = 6 inputs + the last label\n"
      "masks (SPEC 3): --reset-position-ids on, --reset-attention-mask on, --eod-mask-loss on\n"
      "counts: 3 input tokens, 2 loss tokens, 3 pad tokens\n"
      "\n"
      "documents (window slots; a document cut by the window's edge continues in another sample):\n"
      "  doc 0  slots 0..2  \"\xc3\xa9\" <EOD>\n"
      "  doc 1  slots 3..6  <PAD> x 4\n"
      "\n"
      "slot  doc  input         label         loss  position  attends  note\n"
      "0     0    195 '\\xc3'    169 '\\xa9'    1     0         0..0\n"
      "1     0    169 '\\xa9'    256 <EOD>     1     1         0..1     learns the EOD\n"
      "2     0    256 <EOD>     257 <PAD>     0     2         0..2     label is padding: not learned\n"
      "3     1    257 <PAD>     257 <PAD>     0     0         3..3     padding: not learned\n"
      "4     1    257 <PAD>     257 <PAD>     0     1         4..4     padding: not learned\n"
      "5     1    257 <PAD>     257 <PAD>     0     2         5..5     padding: not learned\n";
  EXPECT_EQ(inspect({"--sample", "1", "--packing", "units"}), expected);
}

// Negative control: the columns are the trainers' Sample, so the flags they read change them.
// Sample 1 of concat again (c3 a9 EOD a b EOD | c): learning the EOD inputs counts 6 loss tokens;
// without the resets positions run 0..5 and every slot attends from 0.
TEST_F(DataInspect, TheTrainersFlagsChangeTheColumns) {
  const std::string learned = inspect({"--sample", "1", "--no-eod-mask-loss"});
  EXPECT_NE(learned.find("counts: 6 input tokens, 6 loss tokens, 0 pad tokens\n"), std::string::npos) << learned;
  EXPECT_NE(learned.find("\n5     1    256 <EOD>     99 'c'        1     2         3..5     input is EOD, "
                         "learned (--no-eod-mask-loss)\n"),
            std::string::npos) << learned;
  const std::string unreset = inspect({"--sample", "1", "--no-reset-position-ids", "--no-reset-attention-mask"});
  EXPECT_NE(unreset.find("\n4     1    98 'b'        256 <EOD>     1     4         0..4     learns the EOD\n"),
            std::string::npos) << unreset;
}

TEST_F(DataInspect, BadRequestsAreRefusedWithTheFix) {
  const auto both = run_tandem({"data", "inspect", prefix_, "--data-path", prefix_}, "", "2>&1");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_NE(both.output.find("fix: give one of them"), std::string::npos) << both.output;
  // --data-order megatron for 2 samples: 2 epochs (2 x 6 + 1 > 9), (2 x 9 - 1) // 6 = 2 samples.
  const auto past = run_tandem({"data", "inspect", prefix_, "--seq-length", "6", "--data-order", "megatron",
                                "--train-samples", "2", "--global-batch-size", "1", "--micro-batch-size",
                                "1", "--sample", "2"}, "", "2>&1");
  EXPECT_EQ(past.exit_code, 2) << past.output;
  EXPECT_NE(past.output.find("--sample = 2: Megatron's dataset of the train part holds 2 samples"),
            std::string::npos) << past.output;
}

// A tokenizer without a vocabulary to decode shows ids, and the text says so (NullTokenizer of 300
// ids: EOD 299, so 256 is an ordinary id and the window is one document).
TEST_F(DataInspect, ATokenizerWithoutVocabularyShowsIds) {
  const std::string text = inspect({"--sample", "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "300"});
  EXPECT_NE(text.find("tokens shown as ids (tandem decodes the byte tokenizer, GPT2BPETokenizer and "
                      "byte-level HuggingFaceTokenizer vocabularies only)"), std::string::npos) << text;
  EXPECT_NE(text.find("  doc 0  slots 0..6  ids [97 98 256 99 10 256 195]\n"), std::string::npos) << text;
}

// GPT2BPETokenizer: ids decode through vocab.json's byte-level keys. fixtures/tokenizers/gpt2-tiny
// maps "t<i>" to id i and "<|endoftext|>" to 299 (its EOD); a document of ids 5 17 then EOD reads
// "t5t17" <EOD>.
TEST_F(DataInspect, Gpt2TokensAreDecodedWithTheVocabulary) {
  const fs::path tokenizers = fs::path(TANDEM_SOURCE_DIR) / "fixtures/tokenizers/gpt2-tiny";
  data::IndexedDatasetWriterConfig config;
  config.prefix = (root_ / "gpt2").string();
  config.vocab_size = 300;
  config.eod_token = 299;
  data::IndexedDatasetWriter writer(config);
  for (int document = 0; document < 3; ++document) writer.add_document(std::vector<std::int32_t>{5, 17});
  writer.finish();
  const auto result = run_tandem({"data", "inspect", config.prefix, "--seq-length", "4", "--data-order",
                                  "sequential", "--train-samples", "8", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                                  (tokenizers / "vocab.json").string(), "--merge-file",
                                  (tokenizers / "merges.txt").string()}, "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("; tokens decoded with --vocab-file's byte-level vocabulary\n"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("  doc 0  slots 0..2  \"t5t17\" <EOD>\n"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("\n1     0    17 't17'      299 <EOD>     1     1         0..1     learns the EOD\n"),
            std::string::npos) << result.output;
}

// HuggingFaceTokenizer with a ByteLevel decoder: tokenizer.json's keys are GPT-2's byte alphabet,
// where the bytes that are not printable stand for U+0100 upwards in byte order: space (0x20, the
// 33rd of them) is "Ġ" U+0120, newline (0x0a, the 11th) is "Ċ" U+010A; "é" (c3 a9) is "Ã©". A
// document h i Ġw Ã© Ċ reads "hi wé\n"; the added token <|endoftext|> (id 5) is its EOD.
TEST_F(DataInspect, ByteLevelHuggingFaceTokensAreDecoded) {
  const fs::path model = root_ / "hf";
  fs::create_directories(model);
  std::ofstream(model / "tokenizer.json")
      << nlohmann::json{{"model", {{"type", "BPE"},
                                   {"vocab", {{"h", 0}, {"i", 1}, {"\xc4\xa0w", 2}, {"\xc3\x83\xc2\xa9", 3},
                                              {"\xc4\x8a", 4}}}}},
                        {"decoder", {{"type", "ByteLevel"}}},
                        {"added_tokens", {{{"id", 5}, {"content", "<|endoftext|>"}}}}}.dump();
  std::ofstream(model / "tokenizer_config.json") << nlohmann::json{{"eos_token", "<|endoftext|>"}}.dump();
  data::IndexedDatasetWriterConfig config;
  config.prefix = (root_ / "hf-data").string();
  config.vocab_size = 6;
  config.eod_token = 5;
  data::IndexedDatasetWriter writer(config);
  for (int document = 0; document < 2; ++document) writer.add_document(std::vector<std::int32_t>{0, 1, 2, 3, 4});
  writer.finish();
  const auto result = run_tandem({"data", "inspect", config.prefix, "--seq-length", "6", "--data-order",
                                  "sequential", "--train-samples", "8", "--tokenizer-type",
                                  "HuggingFaceTokenizer", "--tokenizer-model", model.string()}, "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("; tokens decoded with tokenizer.json's byte-level vocabulary\n"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("  doc 0  slots 0..5  \"hi w\xc3\xa9\\n\" <EOD>\n"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("\n2     0    2 ' w'        3 '\xc3\xa9'        1"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem
