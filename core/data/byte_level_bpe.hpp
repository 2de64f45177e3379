// Byte-level BPE text -> token ids, as GPT-2 and Llama 3 tokenize, for `tandem data build`
// (docs/DATA.md section 13, "Tokenizing text"). Two sources, each read as Megatron reads it:
// - GPT-2's vocab.json + merges.txt (--tokenizer-type GPT2BPETokenizer): Megatron-LM's own GPT-2
//   tokenizer, GPT-2's pre-tokenizer regex, no special tokens matched in the text;
// - a Hugging Face tokenizer.json whose model is BPE over the byte-level alphabet
//   (--tokenizer-type HuggingFaceTokenizer): the added tokens split out first, the pre-tokenizer's
//   regexes (GPT-2's, or a Split such as Llama 3's), the merges, then the post-processor's
//   template (a BOS, for Llama 3), as `AutoTokenizer(text).input_ids`.
// Regexes run on PCRE2 (UTF, Unicode properties), with `\s` and `\S` rewritten to the Unicode
// White_Space set that Oniguruma and Python's `regex` use (PCRE2's own `\s` lacks U+0085).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::data {

// A compiled PCRE2 pattern (UTF + UCP); defined in byte_level_bpe.cpp.
class CompiledRegex;

class ByteLevelBpe {
 public:
  // GPT-2's files as Megatron-LM's GPT2BPETokenizer reads them. Throws ConfigError naming
  // --vocab-file or --merge-file, the line, the rule and the fix.
  static ByteLevelBpe from_gpt2_files(const std::string& vocab_file, const std::string& merge_file);
  // DIR/tokenizer.json (and DIR/tokenizer_config.json's tokenizer_class). Refuses, naming the
  // field, any component tandem does not implement rather than tokenizing differently.
  static ByteLevelBpe from_huggingface_dir(const std::string& directory);

  ByteLevelBpe(ByteLevelBpe&&) noexcept;
  ByteLevelBpe& operator=(ByteLevelBpe&&) noexcept;
  ~ByteLevelBpe();

  // The token ids of `utf8_text` (valid UTF-8), post-processor tokens included.
  std::vector<std::int32_t> encode(std::string_view utf8_text);

  // The pre-tokenizer's pieces of a text without added tokens (for tests and diagnosis).
  std::vector<std::string> pre_tokenize(std::string_view utf8_text) const;

  // One line for the build summary: where the tokenizer came from and what it does.
  const std::string& description() const { return description_; }

 private:
  ByteLevelBpe();

  // One pre-tokenizer step: each piece is split by `regex`; matches and the text between them
  // both become pieces (Hugging Face's Split with behavior Isolated; GPT-2's findall, whose
  // pattern leaves no gaps).
  struct SplitStep {
    std::shared_ptr<const CompiledRegex> regex;
  };
  // A token matched in the raw text before pre-tokenization (Hugging Face's added tokens).
  struct AddedToken {
    std::string content;
    std::int32_t id = 0;
  };

  void encode_word(std::string_view word, std::vector<std::int32_t>& out);
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out);
  void encode_added_pass(std::string_view text, std::size_t pass, std::vector<std::int32_t>& out);

  std::string description_;
  std::unordered_map<std::string, std::int32_t> vocab_;       // byte-level key -> id
  std::int32_t byte_ids_[256] = {};                           // id of each byte's one-character key
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;  // (a, b) -> (rank, id)
  std::vector<SplitStep> steps_;
  bool add_prefix_space_ = false;  // ByteLevel's add_prefix_space: a space before a piece not starting with one
  bool ignore_merges_ = false;     // BPE's ignore_merges: a whole word in the vocabulary is one token
  std::vector<std::vector<AddedToken>> added_passes_;  // matched in order: unnormalized, then normalized
  std::vector<std::int32_t> prefix_ids_;  // the post-processor's tokens before the text
  std::vector<std::int32_t> suffix_ids_;  // and after it
  std::unordered_map<std::string, std::vector<std::int32_t>> cache_;  // word -> ids
};

}  // namespace tandem::data
