// Text -> token ids for `tandem data build`, for each tokenizer type tandem can tokenize with
// (docs/DATA.md section 13, "Tokenizing text"), as Megatron's tools/preprocess_data.py calls
// `tokenizer.tokenize(text)` on each document (or each piece of a list-valued document).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/data/tokenizer.hpp"

namespace tandem::data {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // The ids of `utf8_text` (valid UTF-8), without the EOD (the writer appends it).
  virtual std::vector<std::int32_t> tokenize(const std::string& utf8_text) = 0;
  // One line naming the tokenizer and what it read, for the build summary.
  virtual std::string description() const = 0;
  // EOD, PAD and the vocabulary size, as training reads them (tokenizer.hpp).
  const TokenizerIds& ids() const { return ids_; }

 protected:
  TokenizerIds ids_;
};

// The tokenizer `config` names: bytes (SPEC 12), GPT2BPETokenizer (--vocab-file, --merge-file),
// HuggingFaceTokenizer (--tokenizer-model DIR, a byte-level BPE tokenizer.json),
// SentencePieceTokenizer and Llama2Tokenizer (--tokenizer-model FILE.model). Throws ConfigError
// (core/config_issue.hpp) naming the option, the value, the rule and the fix, for a type that cannot
// tokenize text here (NullTokenizer) or files it cannot read.
std::unique_ptr<TextTokenizer> make_text_tokenizer(const TokenizerConfig& config);

}  // namespace tandem::data
