// The tokenizer a dataset was built with, read only as far as training needs it: the vocabulary
// size, the end-of-document id and the padding id, taken as Megatron-LM's tokenizer classes take
// them (SPEC 13; docs/DATA.md section 13 names the Megatron lines each type follows). Text is
// never tokenized here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/config.hpp"

namespace tandem::data {

// Megatron's --tokenizer-type spelling -> the type tandem reads; nullopt for any other text.
// "bytes" names tandem's byte tokenizer (the default when the option is not given).
std::optional<TokenizerType> parse_tokenizer_type(const std::string& name);

// What training takes from a tokenizer.
struct TokenizerIds {
  std::int64_t vocab_size = kByteVocabularySize;  // ids lie in [0, vocab_size), before padding
  std::int32_t eod_token = kEodToken;
  std::int32_t pad_token = kPadToken;             // kNoPadToken: the tokenizer has none
};

// NullTokenizer's options (Megatron Core 0.19's TokenizerConfig).
struct NullTokenizerOptions {
  std::int64_t vocab_size = 0;          // --vocab-size: every id, EOD included
  std::optional<std::int64_t> eod_id;   // --null-tokenizer-eod-id; default vocab_size - 1
  std::int64_t pad_id = kNoPadToken;    // --null-tokenizer-pad-id; -1 = no padding token
};

// Reads the files `tokenizer` names (GPT-2's vocab.json, a Hugging Face tokenizer directory) or
// derives the ids (bytes; NullTokenizer from `null`). A PAD equal to the EOD becomes none.
// Throws ConfigError (core/config_issue.hpp) naming the option, the value, the rule and the fix.
TokenizerIds read_tokenizer_ids(const TokenizerConfig& tokenizer, const NullTokenizerOptions& null = {});

// Parses a JSON file a tokenizer option names (vocab.json, tokenizer.json, ...), refusing a missing
// or malformed one as that option: ConfigError with `field`, `value`, the rule and `fix`.
nlohmann::json read_option_json(const std::filesystem::path& path, const std::string& field, const std::string& value,
                                const std::string& fix);

// "GPT2BPETokenizer (EOD 50256, PAD none, 50257 ids)", for the startup summary.
std::string tokenizer_summary(const TokenizerConfig& tokenizer, std::int64_t vocab_size);

}  // namespace tandem::data
