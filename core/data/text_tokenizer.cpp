// The tokenizers `tandem data build` runs (see text_tokenizer.hpp).
#include "core/data/text_tokenizer.hpp"

#include "core/config_issue.hpp"
#include "core/data/byte_level_bpe.hpp"
#include "core/data/jsonl_builder.hpp"
#include "core/data/sentencepiece_model.hpp"

namespace tandem::data {
namespace {

class ByteTextTokenizer final : public TextTokenizer {
 public:
  ByteTextTokenizer() { ids_ = TokenizerIds{}; }
  std::vector<std::int32_t> tokenize(const std::string& utf8_text) override { return byte_tokenize(utf8_text); }
  std::string description() const override { return "bytes (tandem's byte tokenizer: ids 0-255 are UTF-8 bytes)"; }
};

class BpeTextTokenizer final : public TextTokenizer {
 public:
  BpeTextTokenizer(ByteLevelBpe bpe, TokenizerIds ids) : bpe_(std::move(bpe)) { ids_ = ids; }
  std::vector<std::int32_t> tokenize(const std::string& utf8_text) override { return bpe_.encode(utf8_text); }
  std::string description() const override { return bpe_.description(); }

 private:
  ByteLevelBpe bpe_;
};

// Megatron Core 0.19's SentencePieceTokenizer library (not legacy, ignore_extra_whitespaces on,
// the defaults preprocess_data.py builds it with) tokenizes with encode_as_ids(text): no BOS, no
// EOS, no special token cut out of the text (pieces the model itself defines as user symbols are
// the model's business). Llama2Tokenizer is the same class there.
class SentencePieceTextTokenizer final : public TextTokenizer {
 public:
  SentencePieceTextTokenizer(SentencePieceModel model, TokenizerIds ids, TokenizerType type)
      : model_(std::move(model)), type_(type) {
    ids_ = ids;
  }
  std::vector<std::int32_t> tokenize(const std::string& utf8_text) override { return model_.encode(utf8_text); }
  std::string description() const override {
    return to_string(type_) + " (SentencePiece " + model_.path() + ": " + std::to_string(model_.piece_count()) +
           " pieces, encode_as_ids as Megatron Core 0.19)";
  }

 private:
  SentencePieceModel model_;
  TokenizerType type_;
};

}  // namespace

std::unique_ptr<TextTokenizer> make_text_tokenizer(const TokenizerConfig& config) {
  switch (config.type) {
    case TokenizerType::bytes:
      return std::make_unique<ByteTextTokenizer>();
    case TokenizerType::gpt2_bpe: {
      const TokenizerIds ids = read_tokenizer_ids(config);  // checks both files are given
      return std::make_unique<BpeTextTokenizer>(ByteLevelBpe::from_gpt2_files(config.vocab_file, config.merge_file),
                                                ids);
    }
    case TokenizerType::huggingface: {
      const TokenizerIds ids = read_tokenizer_ids(config);
      return std::make_unique<BpeTextTokenizer>(ByteLevelBpe::from_huggingface_dir(config.tokenizer_model), ids);
    }
    case TokenizerType::null_tokenizer:
      throw ConfigError({ConfigIssue{"--tokenizer-type", "NullTokenizer",
                                     "a NullTokenizer has no text form to tokenize with (its data is ids already)",
                                     "build the data with the tokenizer that made its ids, or write the ids with "
                                     "Megatron's IndexedDatasetBuilder"}});
    case TokenizerType::sentencepiece:
    case TokenizerType::llama2: {
      const TokenizerIds ids = read_tokenizer_ids(config);  // loads and checks the model
      return std::make_unique<SentencePieceTextTokenizer>(
          SentencePieceModel::load(config.tokenizer_model, "--tokenizer-model"), ids, config.type);
    }
  }
  throw ConfigError({ConfigIssue{"--tokenizer-type", to_string(config.type), "cannot tokenize text in tandem",
                                 "use bytes, GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer or "
                                 "Llama2Tokenizer"}});
}

}  // namespace tandem::data
