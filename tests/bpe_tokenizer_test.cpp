// Byte-level BPE (core/data/byte_level_bpe.*) and `tandem data build` with real tokenizers: the
// pieces and ids that can be derived by hand, and every refusal (docs/DATA.md section 13,
// "Tokenizing text"). Token-for-token agreement with Hugging Face and byte-for-byte agreement with
// megatron-core's writer on thousands of characters are tests/tokenizers/check_bpe.py's
// (ctest -R BpeTokenizer).
#include <gtest/gtest.h>

#include <filesystem>
#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/args.hpp"
#include "core/data/byte_level_bpe.hpp"
#include "tests/support/data_build.hpp"
#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using testing::run_tandem;
const fs::path kFixtures = fs::path(TANDEM_SOURCE_DIR) / "fixtures/tokenizers";
const std::string kVocab = (kFixtures / "gpt2-bpe/vocab.json").string();
const std::string kMerges = (kFixtures / "gpt2-bpe/merges.txt").string();
const std::string kLlama3 = (kFixtures / "llama3-bpe").string();

std::int32_t vocab_id(const fs::path& vocab_json, const std::string& token) {
  std::ifstream in(vocab_json);
  return nlohmann::json::parse(in).at(token).get<std::int32_t>();
}

class BpeBuild : public testing::DataBuildTest {
 protected:
  BpeBuild() : DataBuildTest("bpe", R"({"text": "the dog", "body": " the"})" "\n" R"({"text": "", "body": "x"})" "\n") {}
};

// GPT-2's pattern: a whitespace run leaves its last space to the next word (\s+(?!\S)); U+0085
// (NEL) is whitespace to Python's regex and Oniguruma, not to PCRE2's own \s, so " \u0085b" is
// " ", "\u0085", "b" (PCRE2's \s would give " \u0085" as one symbol run, then "b").
TEST(ByteLevelBpe, Gpt2PatternSplitsWhitespaceAsPythonRegexDoes) {
  const ByteLevelBpe bpe = ByteLevelBpe::from_gpt2_files(kVocab, kMerges);
  EXPECT_EQ(bpe.pre_tokenize("Hello  world's 123\n"),
            (std::vector<std::string>{"Hello", " ", " world", "'s", " 123", "\n"}));
  EXPECT_EQ(bpe.pre_tokenize(" \xc2\x85" "b"), (std::vector<std::string>{" ", "\xc2\x85", "b"}));
}

// merges.txt ranks 0..2 are "Ġ t", "Ġt h", "Ġth e": " the" becomes the one token "Ġthe"; Megatron's
// GPT-2 tokenizer matches no special token, so "<|endoftext|>" in the text is not id 434.
TEST(ByteLevelBpe, MergesByRankAndNoSpecialTokenInGpt2Text) {
  ByteLevelBpe bpe = ByteLevelBpe::from_gpt2_files(kVocab, kMerges);
  const fs::path vocab(kVocab);
  EXPECT_EQ(bpe.encode(" the"), std::vector<std::int32_t>{vocab_id(vocab, "\xc4\xa0the")});
  const auto ids = bpe.encode("<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), vocab_id(vocab, "<|endoftext|>")), 0);
}

// Llama 3's form: the template puts <|begin_of_text|> before every text, the empty one too;
// added tokens are cut out of the text first, and only whole ones.
TEST(ByteLevelBpe, Llama3TemplateAndAddedTokens) {
  ByteLevelBpe bpe = ByteLevelBpe::from_huggingface_dir(kLlama3);
  // fixtures/tokenizers/regenerate: the model tokens are gpt2-bpe's vocab.json less its
  // "<|endoftext|>"; <|begin_of_text|> and <|end_of_text|> follow them.
  const std::int32_t bos = vocab_id(kVocab, "<|endoftext|>");
  const std::int32_t eos = bos + 1;
  const std::int32_t x = vocab_id(kVocab, "x");
  EXPECT_EQ(bpe.encode(""), std::vector<std::int32_t>{bos});
  EXPECT_EQ(bpe.encode("<|end_of_text|>x"), (std::vector<std::int32_t>{bos, eos, x}));
  const auto partial = bpe.encode("x<|end_of_text|");
  EXPECT_GT(partial.size(), 3u);
  EXPECT_EQ(std::count(partial.begin(), partial.end(), eos), 0) << "a partial added token is plain text";
}

TEST_F(BpeBuild, JsonKeysPicksTheFieldAndProgressGoesToStderr) {
  const auto result = build({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kVocab, "--merge-file", kMerges,
                             "--json-keys", "body", "--append-eod", "--progress-seconds", "0"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("data build: 2 documents, 4 tokens in "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("tokens:    4 (2 EOD)"), std::string::npos) << result.output;  // Ġthe EOD x EOD
  EXPECT_TRUE(fs::exists(root_ / "ds_body_document.idx"));  // preprocess_data.py's name for the key
  EXPECT_FALSE(fs::exists(root_ / "ds_text_document.idx"));
}

TEST_F(BpeBuild, RefusalsNameTheOptionExitTwoAndKeepTheOldDataset) {
  ASSERT_EQ(build({}).exit_code, 0);
  const std::string bin = testing::bytes_of(root_ / "ds_text_document.bin");
  const std::string idx = testing::bytes_of(root_ / "ds_text_document.idx");
  std::ofstream(root_ / "no-header.txt") << "\xc4\xa0 t\n";
  fs::create_directories(root_ / "normalized");
  {
    std::ifstream in(kLlama3 + "/tokenizer.json");
    nlohmann::json definition = nlohmann::json::parse(in);
    definition["normalizer"] = {{"type", "NFC"}};
    std::ofstream(root_ / "normalized/tokenizer.json") << definition.dump();
    fs::copy_file(kLlama3 + "/tokenizer_config.json", root_ / "normalized/tokenizer_config.json");
  }
  const struct {
    std::vector<std::string> options;
    std::string says;
  } cases[] = {
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kVocab, "--merge-file", (root_ / "no-header.txt").string()},
       "--merge-file = " + (root_ / "no-header.txt").string() + ": line 1 is not a \"#version\" header"},
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", (kFixtures / "gpt2-tiny/vocab.json").string(),
        "--merge-file", kMerges},
       "has no token for byte 0"},
      {{"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", (kFixtures / "hf-tiny").string()},
       "no ByteLevel step: not a byte-level BPE"},
      {{"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", (root_ / "normalized").string()},
       "tokenizer.json's normalizer"},
      {{"--split-sentences"}, "--split-sentences = given: tandem does not split documents into sentences"},
      {{"--json-keys", "text", "body", "text"}, "--json-keys = text (twice): each key writes its own dataset"},
      {{"--tokenizer-type", "NullTokenizer"}, "a NullTokenizer has no text form"},
      {{"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", "x.model"},
       "--tokenizer-model = x.model: is not a readable file"},
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kVocab}, "--merge-file = not given"},
      {{"--tokenizer-model", kLlama3}, "--tokenizer-model = " + kLlama3 + ": is read only by --tokenizer-type"},
  };
  for (const auto& refused : cases) {
    expect_build_refused(refused.options, refused.says);
  }
  // A bad line after good ones, with a real tokenizer: exit 2, the old pair untouched.
  std::ofstream(root_ / "docs.jsonl", std::ios::app) << "{\"text\": 5}\n";
  const auto bad_line = build({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kLlama3});
  EXPECT_EQ(bad_line.exit_code, 2) << bad_line.output;
  EXPECT_NE(bad_line.output.find("docs.jsonl:3:"), std::string::npos) << bad_line.output;
  EXPECT_EQ(testing::bytes_of(root_ / "ds_text_document.bin"), bin);
  EXPECT_EQ(testing::bytes_of(root_ / "ds_text_document.idx"), idx);
}

}  // namespace
}  // namespace tandem::data
