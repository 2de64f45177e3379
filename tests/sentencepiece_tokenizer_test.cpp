// SentencePieceTokenizer and Llama2Tokenizer (core/data/sentencepiece_model.*, docs/DATA.md
// section 13): the ids read from a .model as Megatron Core 0.19 takes them, the encoder's pieces
// where they can be derived by hand, `tandem data build` with them, and every refusal (exit 2,
// naming the option, the value, the rule and the fix). Agreement with Megatron's own
// build_tokenizer over the PyPI sentencepiece, token for token and byte for byte on thousands of
// characters, is tests/tokenizers/check_sentencepiece.py's (ctest -R SentencePieceTokenizer).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/args.hpp"
#include "core/data/indexed_dataset.hpp"
#include "core/data/sentencepiece_model.hpp"
#include "core/data/tokenizer.hpp"
#include "tests/support/data_build.hpp"
#include "tests/support/files.hpp"
#include "tests/support/parse_run.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using testing::run_tandem;

// fixtures/tokenizers/regenerate-sentencepiece trains these (sentencepiece 0.2.0, one thread).
const fs::path kFixtures = fs::path(TANDEM_SOURCE_DIR) / "fixtures/tokenizers";
const std::string kUnigram = (kFixtures / "sp-unigram/tokenizer.model").string();  // pad_id=3, "<sep>"
const std::string kLlama2 = (kFixtures / "sp-llama2/tokenizer.model").string();    // BPE, byte fallback
const std::string kNoEos = (kFixtures / "sp-no-eos/tokenizer.model").string();     // eos_id=-1

// sentencepiece's trainer defaults: unk 0, bos 1, eos 2; pad -1 unless --pad_id.
constexpr std::int32_t kUnk = 0;
constexpr std::int32_t kBos = 1;
constexpr std::int32_t kEos = 2;
// With byte fallback the 256 byte pieces <0x00>..<0xFF> follow the meta pieces (unk, bos, eos).
constexpr std::int32_t kFirstBytePiece = 3;

TEST(SentencePieceModel, ReadsTheModelsPiecesAndSpecialIds) {
  const auto llama2 = SentencePieceModel::load(kLlama2, "--tokenizer-model");
  EXPECT_EQ(llama2.piece_count(), 600);  // regenerate's vocab_size=600 (a hard limit)
  EXPECT_EQ(llama2.unk_id(), kUnk);
  EXPECT_EQ(llama2.bos_id(), kBos);
  EXPECT_EQ(llama2.eos_id(), kEos);
  EXPECT_EQ(llama2.pad_id(), -1);
  EXPECT_EQ(llama2.piece(kFirstBytePiece), "<0x00>");
  EXPECT_EQ(llama2.piece(kFirstBytePiece + 0xFF), "<0xFF>");

  const auto unigram = SentencePieceModel::load(kUnigram, "--tokenizer-model");
  EXPECT_EQ(unigram.pad_id(), 3);                       // regenerate's pad_id=3
  EXPECT_EQ(unigram.piece(3), "<pad>");
  EXPECT_EQ(unigram.piece(4), "<sep>");                 // the user-defined symbol follows the meta pieces
}

// Llama 2's settings: a character the model lacks falls back to its UTF-8 bytes; digits split.
TEST(SentencePieceModel, ByteFallbackAndSplitDigitsGiveDerivableIds) {
  const auto llama2 = SentencePieceModel::load(kLlama2, "--tokenizer-model");
  // U+0F00 (TIBETAN SYLLABLE OM) is E0 BC 80 in UTF-8, in no training text.
  const std::vector<std::int32_t> om = llama2.encode("\xe0\xbc\x80");
  ASSERT_GE(om.size(), 3U);
  const std::vector<std::int32_t> bytes(om.end() - 3, om.end());
  EXPECT_EQ(bytes, (std::vector<std::int32_t>{kFirstBytePiece + 0xE0, kFirstBytePiece + 0xBC,
                                              kFirstBytePiece + 0x80}));
  // split_digits: "1234" is four single-digit pieces, whatever the merges learned.
  const std::vector<std::int32_t> digits = llama2.encode("1234");
  std::vector<std::string> pieces;
  for (const std::int32_t id : digits) pieces.push_back(llama2.piece(id));
  ASSERT_FALSE(pieces.empty());
  const std::vector<std::string> tail(pieces.end() - 4, pieces.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"1", "2", "3", "4"}));
}

// Megatron Core 0.19 (and 0.16.1 without --legacy-tokenizer): vocabulary = the pieces, EOD = the
// model's EOS, PAD = its pad piece or none; the same for both type names.
TEST(SentencePieceTokenizerIds, AsMegatronCoreTakesThem) {
  TokenizerConfig config;
  config.type = TokenizerType::sentencepiece;
  config.tokenizer_model = kUnigram;
  const auto unigram = SentencePieceModel::load(kUnigram, "--tokenizer-model");
  const TokenizerIds ids = read_tokenizer_ids(config);
  EXPECT_EQ(ids.vocab_size, unigram.piece_count());
  EXPECT_EQ(ids.eod_token, kEos);
  EXPECT_EQ(ids.pad_token, 3);

  config.type = TokenizerType::llama2;
  config.tokenizer_model = kLlama2;
  const TokenizerIds llama = read_tokenizer_ids(config);
  EXPECT_EQ(llama.vocab_size, 600);
  EXPECT_EQ(llama.eod_token, kEos);
  EXPECT_EQ(llama.pad_token, kNoPadToken);

  // Through the run's options: the startup summary and the model's vocabulary.
  const RunConfig run = testing::parse_run(
      {"--train-samples", "8", "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", kLlama2});
  EXPECT_EQ(run.model.vocab_size, 600);
  EXPECT_EQ(run.tokenizer.eod_token, kEos);
  EXPECT_EQ(run.tokenizer.pad_token, kNoPadToken);
}

class SentencePieceBuild : public testing::DataBuildTest {
 protected:
  SentencePieceBuild()
      : DataBuildTest("sp", R"({"text": "1234"})" "\n" R"({"text": ""})" "\n" "{\"text\": \"\xe0\xbc\x80\"}\n") {}
};

// Each non-empty document is the model's encode_as_ids with the EOD (EOS) after it, no BOS; the
// empty one is recorded with no tokens (preprocess_data.py --append-eod).
TEST_F(SentencePieceBuild, DocumentsAreEncodeAsIdsThenTheEod) {
  const auto result = build({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", kLlama2});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("tokenizer: Llama2Tokenizer: EOD 2, PAD none, 600 ids"), std::string::npos)
      << result.output;
  const auto model = SentencePieceModel::load(kLlama2, "--tokenizer-model");
  const IndexedDataset dataset = IndexedDataset::open((root_ / "ds_text_document").string());
  ASSERT_EQ(dataset.sequence_count(), 2);  // the empty document has no sequence
  EXPECT_EQ(dataset.document_count(), 3);
  std::vector<std::int32_t> first = model.encode("1234");
  first.push_back(kEos);
  std::vector<std::int32_t> third = model.encode("\xe0\xbc\x80");
  third.push_back(kEos);
  EXPECT_EQ(dataset.sequence_tokens(0), first);
  EXPECT_EQ(dataset.sequence_tokens(1), third);
  EXPECT_NE(dataset.sequence_tokens(0).front(), kBos);  // Megatron Core 0.19 adds no BOS
}

TEST_F(SentencePieceBuild, RefusalsNameTheOptionExitTwoAndKeepTheOldDataset) {
  ASSERT_EQ(build({"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", kUnigram}).exit_code, 0);
  const std::string bin = testing::bytes_of(root_ / "ds_text_document.bin");
  const std::string idx = testing::bytes_of(root_ / "ds_text_document.idx");
  std::ofstream(root_ / "text.model") << "this is not a protobuf\n";
  const std::string missing = (root_ / "missing.model").string();
  const std::string text = (root_ / "text.model").string();
  const struct {
    std::vector<std::string> options;
    std::string says;
  } cases[] = {
      {{"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", missing},
       "--tokenizer-model = " + missing + ": is not a readable file"},
      {{"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", text},
       "--tokenizer-model = " + text + ": is not a SentencePiece model"},
      {{"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", root_.string()},
       "--tokenizer-model = " + root_.string() + ": is not a readable file"},
      {{"--tokenizer-type", "SentencePieceTokenizer"}, "--tokenizer-model = not given"},
      {{"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", kNoEos},
       "--tokenizer-model = " + kNoEos + ": the model has no EOS piece"},
      {{"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", kUnigram, "--vocab-file", kUnigram},
       "--vocab-file = " + kUnigram + ": is read only by --tokenizer-type GPT2BPETokenizer"},
  };
  for (const auto& refused : cases) {
    expect_build_refused(refused.options, refused.says);
    EXPECT_EQ(testing::bytes_of(root_ / "ds_text_document.bin"), bin);
    EXPECT_EQ(testing::bytes_of(root_ / "ds_text_document.idx"), idx);
  }
}

// The same refusals where a run reads the ids (tandem plan/train/check): ConfigError on the option.
TEST(SentencePieceTokenizerIds, RunRefusesMissingAndBrokenModels) {
  const auto issue = [](const std::vector<std::string>& arguments) -> std::string {
    try {
      testing::parse_run(testing::with({"--train-samples", "8"}, arguments));
    } catch (const ConfigError& error) {
      return error.what();
    }
    return "accepted";
  };
  const std::string missing = "/nonexistent/tokenizer.model";
  EXPECT_NE(issue({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", missing})
                .find("--tokenizer-model = " + missing + ": is not a readable file"),
            std::string::npos);
  EXPECT_NE(issue({"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", kNoEos}).find("no EOS piece"),
            std::string::npos);
  EXPECT_NE(issue({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", kLlama2, "--vocab-size", "601"})
                .find("--vocab-size"),
            std::string::npos);
  // A directory (a Hugging Face tokenizer's) is not a .model.
  EXPECT_NE(issue({"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                   (kFixtures / "hf-tiny").string()})
                .find("is not a readable file"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::data
