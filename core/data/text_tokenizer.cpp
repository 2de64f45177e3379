// The tokenizers `tandem data build` runs (see text_tokenizer.hpp).
#include "core/data/text_tokenizer.hpp"

#include "core/args.hpp"
#include "core/data/byte_level_bpe.hpp"
#include "core/data/jsonl_builder.hpp"

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
    case TokenizerType::llama2:
      read_tokenizer_ids(config);  // refuses with the reason
      break;
  }
  throw ConfigError({ConfigIssue{"--tokenizer-type", to_string(config.type), "cannot tokenize text in tandem",
                                 "use bytes, GPT2BPETokenizer or HuggingFaceTokenizer"}});
}

}  // namespace tandem::data
