// Byte-level BPE (see byte_level_bpe.hpp; the readings of Megatron and Hugging Face are in
// docs/DATA.md section 13, "Tokenizing text").
#include "core/data/byte_level_bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/config_issue.hpp"
#include "core/data/tokenizer.hpp"

namespace tandem::data {
namespace {

[[noreturn]] void refuse(std::string field, std::string value, std::string rule, std::string fix) {
  throw ConfigError({ConfigIssue{std::move(field), std::move(value), std::move(rule), std::move(fix)}});
}

// The 25 characters of Unicode's White_Space property: what `\s` means in Oniguruma (Hugging
// Face's tokenizers) and in Python's `regex` (Megatron's GPT-2 tokenizer), checked code point by
// code point (tests/tokenizers). PCRE2's `\s` under UCP lacks U+0085, so patterns use this class.
constexpr const char* kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// GPT-2's pre-tokenizer pattern (Megatron's gpt2_tokenization.py; Hugging Face's ByteLevel with
// use_regex): contractions, letters, digits, other symbols each with one optional leading space,
// then whitespace runs that leave their last space to the next word.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rewrites `\s` and `\S` of an Oniguruma/`regex` pattern for PCRE2 (kWhiteSpace); leaves every
// other escape as written. Returns nullopt-like empty string with `error` set for `\S` inside a
// character class, which a class cannot say.
std::string translate_whitespace(const std::string& pattern, std::string& error) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (next == 'S') {
        if (in_class) {
          error = "\\S inside a character class";
          return {};
        }
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' or '^]' right after the opening bracket is a literal, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
      const auto end = pattern.find(":]", i + 2);
      if (end != std::string::npos) {
        out += pattern.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xe) return 3;
  return 4;
}

// GPT-2's bytes_to_unicode as UTF-8 keys: the printable bytes '!'..'~', 0xa1..0xac, 0xae..0xff
// stand for themselves, the other 68 for U+0100 upwards in byte order.
std::array<std::string, 256> byte_level_keys() {
  std::array<std::string, 256> keys;
  char32_t next = 0x100;
  for (unsigned byte = 0; byte < 256; ++byte) {
    const bool itself = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) || byte >= 0xae;
    const char32_t point = itself ? static_cast<char32_t>(byte) : next++;
    std::string key;
    if (point < 0x80) {
      key += static_cast<char>(point);
    } else {  // every point here is below U+0800: two bytes
      key += static_cast<char>(0xc0 | (point >> 6));
      key += static_cast<char>(0x80 | (point & 0x3f));
    }
    keys[byte] = key;
  }
  return keys;
}

const std::array<std::string, 256>& byte_level_keys_cached() {
  static const std::array<std::string, 256> keys = byte_level_keys();
  return keys;
}

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

}  // namespace

class CompiledRegex {
 public:
  // Compiles `pattern` (Oniguruma / Python `regex` syntax) for PCRE2; throws ConfigError naming
  // `field` and `value` when it cannot.
  CompiledRegex(const std::string& pattern, const std::string& field, const std::string& value) {
    std::string error;
    const std::string translated = translate_whitespace(pattern, error);
    if (!error.empty()) {
      refuse(field, value, "the pre-tokenizer pattern " + nlohmann::json(pattern).dump() + " uses " + error +
                               ", which tandem cannot translate to PCRE2",
             "use a tokenizer whose pattern spells that class out, or tokenize with Megatron");
    }
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                          PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(code, message, sizeof(message));
      refuse(field, value, "the pre-tokenizer pattern " + nlohmann::json(pattern).dump() +
                               " does not compile with PCRE2 (" + reinterpret_cast<const char*>(message) +
                               " at offset " + std::to_string(offset) + ")",
             "use a tokenizer whose pattern PCRE2 reads (GPT-2's and Llama 3's do)");
    }
    // JIT only speeds matching up; the interpreter gives the same matches when it is unavailable.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  CompiledRegex(const CompiledRegex&) = delete;
  CompiledRegex& operator=(const CompiledRegex&) = delete;
  ~CompiledRegex() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }

  // Appends to `pieces` the matches of this pattern in `text` and the non-empty text between
  // them, in order (Hugging Face's Split, behavior Isolated). `text` is valid UTF-8.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const {
    std::size_t emitted = 0;  // end of the last piece appended
    std::size_t start = 0;    // where the next search begins
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (start < text.size()) {
      const int found = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match_, nullptr);
      if (found == PCRE2_ERROR_NOMATCH) break;
      if (found < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(found, message, sizeof(message));
        throw std::runtime_error(std::string("PCRE2 match failed: ") + reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_);
      const std::size_t begin = ovector[0];
      const std::size_t end = ovector[1];
      if (end == begin) {  // an empty match splits nothing; step over one character
        start = begin + utf8_length(static_cast<unsigned char>(text[begin]));
        continue;
      }
      if (begin > emitted) pieces.push_back(text.substr(emitted, begin - emitted));
      pieces.push_back(text.substr(begin, end - begin));
      emitted = end;
      start = end;
    }
    if (emitted < text.size()) pieces.push_back(text.substr(emitted));
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;  // one per pattern: a tokenizer is used by one thread
};

ByteLevelBpe::ByteLevelBpe() = default;
ByteLevelBpe::ByteLevelBpe(ByteLevelBpe&&) noexcept = default;
ByteLevelBpe& ByteLevelBpe::operator=(ByteLevelBpe&&) noexcept = default;
ByteLevelBpe::~ByteLevelBpe() = default;

ByteLevelBpe ByteLevelBpe::from_gpt2_files(const std::string& vocab_file, const std::string& merge_file) {
  ByteLevelBpe bpe;
  const std::string vocab_fix = "give --vocab-file GPT-2's vocab.json (byte-level keys -> ids)";
  const nlohmann::json encoder = read_option_json(vocab_file, "--vocab-file", vocab_file, vocab_fix);
  if (!encoder.is_object()) refuse("--vocab-file", vocab_file, "must hold one JSON object of token -> id", vocab_fix);
  for (const auto& [token, id] : encoder.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX) {
      refuse("--vocab-file", vocab_file, "token " + nlohmann::json(token).dump() + " has id " + id.dump() +
                                             "; expected an integer in [0, 2^31)", vocab_fix);
    }
    bpe.vocab_[token] = id.get<std::int32_t>();
  }
  const auto keys = byte_level_keys();
  for (unsigned byte = 0; byte < 256; ++byte) {
    const auto found = bpe.vocab_.find(keys[byte]);
    if (found == bpe.vocab_.end()) {
      refuse("--vocab-file", vocab_file,
             "has no token for byte " + std::to_string(byte) + " (key " + nlohmann::json(keys[byte]).dump() +
                 "); a byte-level BPE vocabulary holds all 256 bytes' keys, so every text can be tokenized",
             vocab_fix);
    }
    bpe.byte_ids_[byte] = found->second;
  }

  // Megatron's GPT-2 reader drops the first line of merges.txt (the "#version" header) and the
  // last (empty after the final newline). tandem holds the file to that shape rather than lose a
  // merge silently.
  const std::string merges_fix = "give --merge-file GPT-2's merges.txt: a \"#version\" line, then one \"LEFT RIGHT\" "
                                 "merge per line, ending with a newline";
  std::ifstream merges(merge_file, std::ios::binary);
  if (!merges) refuse("--merge-file", merge_file, "cannot open it", merges_fix);
  std::stringstream buffer;
  buffer << merges.rdbuf();
  const std::string text = buffer.str();
  if (text.rfind("#version", 0) != 0) {
    refuse("--merge-file", merge_file, "line 1 is not a \"#version\" header (Megatron's reader skips line 1 unread)",
           merges_fix);
  }
  if (text.back() != '\n') {
    refuse("--merge-file", merge_file, "does not end with a newline (Megatron's reader would drop the last merge)",
           merges_fix);
  }
  std::size_t line_start = text.find('\n') + 1;
  std::int32_t rank = 0;
  for (std::int64_t line_number = 2; line_start < text.size(); ++line_number) {
    const std::size_t line_end = text.find('\n', line_start);
    const std::string line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    const auto space = line.find(' ');
    const std::string where = "line " + std::to_string(line_number) + " " + nlohmann::json(line).dump();
    if (space == std::string::npos || space == 0 || line.find(' ', space + 1) != std::string::npos ||
        space + 1 == line.size()) {
      refuse("--merge-file", merge_file, where + " is not two tokens separated by one space", merges_fix);
    }
    const std::string left = line.substr(0, space);
    const std::string right = line.substr(space + 1);
    const auto left_id = bpe.vocab_.find(left);
    const auto right_id = bpe.vocab_.find(right);
    const auto merged_id = bpe.vocab_.find(left + right);
    if (left_id == bpe.vocab_.end() || right_id == bpe.vocab_.end() || merged_id == bpe.vocab_.end()) {
      refuse("--merge-file", merge_file,
             where + " names a token that --vocab-file " + vocab_file + " lacks (both parts and their join "
                     "must be tokens)",
             "give the merges.txt that belongs to this vocab.json");
    }
    // The first occurrence of a pair keeps its rank (a later duplicate never wins the minimum).
    bpe.merges_.emplace(pair_key(left_id->second, right_id->second), std::make_pair(rank++, merged_id->second));
  }
  bpe.steps_.push_back({std::make_shared<CompiledRegex>(kGpt2Pattern, "--vocab-file", vocab_file)});
  bpe.added_passes_.clear();  // Megatron's GPT-2 tokenizer matches no special token in the text
  bpe.description_ = "GPT2BPETokenizer (Megatron's GPT-2 BPE: " + std::to_string(bpe.vocab_.size()) +
                     " tokens, " + std::to_string(rank) + " merges, GPT-2's pre-tokenizer regex)";
  return bpe;
}

ByteLevelBpe ByteLevelBpe::from_huggingface_dir(const std::string& directory) {
  ByteLevelBpe bpe;
  const std::string field = "--tokenizer-model";
  const std::string fix = "give --tokenizer-model a byte-level BPE tokenizer directory (GPT-2 or Llama 3 style "
                          "tokenizer.json), or build the data with Megatron's tools/preprocess_data.py";
  const std::filesystem::path root(directory);
  const nlohmann::json definition = read_option_json(root / "tokenizer.json", field, directory, fix);
  const auto unsupported = [&](const std::string& what) {
    refuse(field, directory, "tokenizer.json's " + what + " is not implemented by tandem's byte-level BPE", fix);
  };
  const auto get = [](const nlohmann::json& object, const char* key) -> const nlohmann::json* {
    if (!object.is_object() || !object.contains(key) || object.at(key).is_null()) return nullptr;
    return &object.at(key);
  };

  // transformers' AutoTokenizer class: the generic fast tokenizer (or GPT-2's, which adds
  // nothing) applies tokenizer.json as written; other classes rewrite parts of it.
  const std::filesystem::path config_path = root / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const nlohmann::json config = read_option_json(config_path, field, directory, fix);
    if (const auto* tokenizer_class = get(config, "tokenizer_class")) {
      const std::string name = tokenizer_class->is_string() ? tokenizer_class->get<std::string>() : tokenizer_class->dump();
      if (name != "PreTrainedTokenizerFast" && name != "GPT2Tokenizer" && name != "GPT2TokenizerFast") {
        refuse(field, directory, "tokenizer_config.json's tokenizer_class " + name +
                                     " is not one tandem reproduces (PreTrainedTokenizerFast, GPT2Tokenizer, "
                                     "GPT2TokenizerFast apply tokenizer.json as written)", fix);
      }
    }
  }

  if (get(definition, "normalizer") != nullptr) unsupported("normalizer " + definition.at("normalizer").dump().substr(0, 80));
  const nlohmann::json* model = get(definition, "model");
  if (model == nullptr || !model->is_object() || model->value("type", "") != "BPE") {
    unsupported("model (only \"type\": \"BPE\" is)");
  }
  if (get(*model, "dropout") != nullptr) unsupported("model.dropout (it makes tokenization random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto* value = get(*model, key); value != nullptr && *value != "") unsupported(std::string("model.") + key);
  }
  if (const auto* value = get(*model, "byte_fallback"); value != nullptr && *value == true) {
    unsupported("model.byte_fallback (a SentencePiece-style BPE, not byte-level)");
  }
  if (const auto* value = get(*model, "ignore_merges")) bpe.ignore_merges_ = value->get<bool>();
  const nlohmann::json* vocab = get(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) unsupported("model.vocab (expected token -> id)");
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX) {
      refuse(field, directory, "token " + nlohmann::json(token).dump() + " has id " + id.dump(), fix);
    }
    bpe.vocab_[token] = id.get<std::int32_t>();
  }

  // Pre-tokenizer: Split steps, and the ByteLevel step (its GPT-2 regex when use_regex), which
  // must be there: it is what makes the model's alphabet the 256 bytes.
  bool byte_level = false;
  const auto add_step = [&](const nlohmann::json& step, auto& self) -> void {
    const std::string type = step.value("type", "");
    if (type == "Sequence") {
      for (const auto& inner : step.at("pretokenizers")) self(inner, self);
    } else if (type == "ByteLevel") {
      if (byte_level) unsupported("pre_tokenizer (two ByteLevel steps)");
      byte_level = true;
      bpe.add_prefix_space_ = step.value("add_prefix_space", false);
      if (bpe.add_prefix_space_ && !bpe.steps_.empty()) unsupported("pre_tokenizer (add_prefix_space after a Split)");
      if (step.value("use_regex", true)) {
        bpe.steps_.push_back({std::make_shared<CompiledRegex>(kGpt2Pattern, field, directory)});
      }
    } else if (type == "Split") {
      if (byte_level) unsupported("pre_tokenizer (a Split after ByteLevel)");
      if (step.value("behavior", "") != "Isolated" || step.value("invert", false)) {
        unsupported("pre_tokenizer Split with behavior " + step.value("behavior", std::string("?")) +
                    (step.value("invert", false) ? ", inverted" : "") + " (only Isolated, not inverted, is)");
      }
      const nlohmann::json& pattern = step.at("pattern");
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = pattern.at("Regex").get<std::string>();
      } else if (pattern.contains("String")) {  // a literal: quote every character for PCRE2
        regex = "\\Q" + pattern.at("String").get<std::string>() + "\\E";
      } else {
        unsupported("pre_tokenizer Split pattern " + pattern.dump());
      }
      bpe.steps_.push_back({std::make_shared<CompiledRegex>(regex, field, directory)});
    } else {
      unsupported("pre_tokenizer " + (type.empty() ? step.dump().substr(0, 80) : type));
    }
  };
  const nlohmann::json* pre_tokenizer = get(definition, "pre_tokenizer");
  if (pre_tokenizer != nullptr) add_step(*pre_tokenizer, add_step);
  if (!byte_level) unsupported("pre_tokenizer (no ByteLevel step: not a byte-level BPE)");

  const auto keys = byte_level_keys();
  for (unsigned byte = 0; byte < 256; ++byte) {
    const auto found = bpe.vocab_.find(keys[byte]);
    if (found == bpe.vocab_.end()) {
      refuse(field, directory, "model.vocab has no token for byte " + std::to_string(byte) + " (key " +
                                   nlohmann::json(keys[byte]).dump() + "); a byte-level BPE holds all 256", fix);
    }
    bpe.byte_ids_[byte] = found->second;
  }

  const nlohmann::json* merges = get(*model, "merges");
  std::int32_t rank = 0;
  if (merges != nullptr) {
    for (const auto& merge : *merges) {
      std::string left;
      std::string right;
      if (merge.is_string()) {  // "LEFT RIGHT"
        const std::string text = merge.get<std::string>();
        const auto space = text.find(' ');
        if (space == std::string::npos) unsupported("merge " + merge.dump());
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2) {  // ["LEFT", "RIGHT"]
        left = merge.at(0).get<std::string>();
        right = merge.at(1).get<std::string>();
      } else {
        unsupported("merge " + merge.dump());
      }
      const auto left_id = bpe.vocab_.find(left);
      const auto right_id = bpe.vocab_.find(right);
      const auto merged_id = bpe.vocab_.find(left + right);
      if (left_id == bpe.vocab_.end() || right_id == bpe.vocab_.end() || merged_id == bpe.vocab_.end()) {
        refuse(field, directory, "merge " + std::to_string(rank) + " " + merge.dump() +
                                     " names a token model.vocab lacks", fix);
      }
      bpe.merges_.emplace(pair_key(left_id->second, right_id->second), std::make_pair(rank++, merged_id->second));
    }
  }

  // Added tokens are cut out of the raw text before anything else: those not normalized first,
  // then the normalized ones (the same text here: tandem takes no normalizer).
  bpe.added_passes_.assign(2, {});
  if (const auto* added = get(definition, "added_tokens")) {
    for (const auto& token : *added) {
      const std::string content = token.at("content").get<std::string>();
      for (const char* option : {"single_word", "lstrip", "rstrip"}) {
        if (token.value(option, false)) {
          unsupported("added token " + nlohmann::json(content).dump() + " with " + option + " true");
        }
      }
      if (content.empty()) continue;
      bpe.added_passes_[token.value("normalized", false) ? 1 : 0].push_back({content, token.at("id").get<std::int32_t>()});
    }
  }

  // Post-processor: ByteLevel changes no id; TemplateProcessing's "single" template puts its
  // special tokens around the text (Llama 3's BOS).
  const auto add_processor = [&](const nlohmann::json& processor, auto& self) -> void {
    const std::string type = processor.value("type", "");
    if (type == "Sequence") {
      for (const auto& inner : processor.at("processors")) self(inner, self);
    } else if (type == "ByteLevel") {
      // offsets only
    } else if (type == "TemplateProcessing") {
      if (!bpe.prefix_ids_.empty() || !bpe.suffix_ids_.empty()) unsupported("post_processor (two templates)");
      bool after_text = false;
      for (const auto& item : processor.at("single")) {
        if (item.contains("Sequence")) {
          if (after_text) unsupported("post_processor template with the text twice");
          after_text = true;
        } else if (item.contains("SpecialToken")) {
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          const auto& specials = processor.at("special_tokens");
          if (!specials.contains(name)) unsupported("post_processor special token " + name + " (not defined)");
          for (const auto& id : specials.at(name).at("ids")) {
            (after_text ? bpe.suffix_ids_ : bpe.prefix_ids_).push_back(id.get<std::int32_t>());
          }
        } else {
          unsupported("post_processor template item " + item.dump());
        }
      }
    } else {
      unsupported("post_processor " + (type.empty() ? processor.dump().substr(0, 80) : type));
    }
  };
  if (const auto* post_processor = get(definition, "post_processor")) add_processor(*post_processor, add_processor);

  std::size_t added_count = bpe.added_passes_[0].size() + bpe.added_passes_[1].size();
  bpe.description_ = "HuggingFaceTokenizer (byte-level BPE from " + (root / "tokenizer.json").string() + ": " +
                     std::to_string(bpe.vocab_.size()) + " model tokens, " + std::to_string(rank) + " merges, " +
                     std::to_string(added_count) + " added tokens, " + std::to_string(bpe.steps_.size()) +
                     " pre-tokenizer regex" + (bpe.steps_.size() == 1 ? "" : "es") +
                     (bpe.prefix_ids_.empty() && bpe.suffix_ids_.empty() ? "" : ", a post-processor template") + ")";
  return bpe;
}

std::vector<std::string> ByteLevelBpe::pre_tokenize(std::string_view utf8_text) const {
  std::string text(utf8_text);
  if (add_prefix_space_ && (text.empty() || text.front() != ' ')) text.insert(text.begin(), ' ');
  std::vector<std::string_view> pieces{text};
  for (const SplitStep& step : steps_) {
    std::vector<std::string_view> next;
    for (const auto piece : pieces) step.regex->split(piece, next);
    pieces = std::move(next);
  }
  return {pieces.begin(), pieces.end()};
}

void ByteLevelBpe::encode_word(std::string_view word, std::vector<std::int32_t>& out) {
  if (const auto cached = cache_.find(std::string(word)); cached != cache_.end()) {
    out.insert(out.end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<std::int32_t> symbols;  // [characters of the word's byte-level key]
  symbols.reserve(word.size());
  for (const char byte : word) symbols.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
  bool whole = false;
  if (ignore_merges_) {  // Hugging Face's ignore_merges: a word that is a token is taken whole
    std::string key;
    for (const char byte : word) key += byte_level_keys_cached()[static_cast<unsigned char>(byte)];
    if (const auto found = vocab_.find(key); found != vocab_.end()) {
      symbols.assign(1, found->second);
      whole = true;
    }
  }
  // GPT-2's BPE: merge the adjacent pair of lowest rank everywhere it occurs, left to right, until
  // no adjacent pair has a rank.
  std::vector<std::int32_t> merged;
  while (!whole && symbols.size() > 1) {
    std::int32_t best_rank = INT32_MAX;
    std::uint64_t best_pair = 0;
    std::int32_t best_id = 0;
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto found = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (found != merges_.end() && found->second.first < best_rank) {
        best_rank = found->second.first;
        best_pair = found->first;
        best_id = found->second.second;
      }
    }
    if (best_rank == INT32_MAX) break;
    merged.clear();
    for (std::size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && pair_key(symbols[i], symbols[i + 1]) == best_pair) {
        merged.push_back(best_id);
        i += 2;
      } else {
        merged.push_back(symbols[i++]);
      }
    }
    symbols.swap(merged);
  }
  constexpr std::size_t kCacheLimit = 1 << 20;  // words; bounded so a huge corpus cannot grow it forever
  if (cache_.size() >= kCacheLimit) cache_.clear();
  cache_.emplace(std::string(word), symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void ByteLevelBpe::encode_plain(std::string_view text, std::vector<std::int32_t>& out) {
  if (text.empty()) return;
  for (const std::string& word : pre_tokenize(text)) encode_word(word, out);
}

// Cuts pass `pass`'s added tokens out of `text` (leftmost match first, the longest among those
// starting there), hands the text between them to the next pass, then to the BPE.
void ByteLevelBpe::encode_added_pass(std::string_view text, std::size_t pass, std::vector<std::int32_t>& out) {
  if (pass >= added_passes_.size()) {
    encode_plain(text, out);
    return;
  }
  const auto& tokens = added_passes_[pass];
  std::vector<std::size_t> next_at(tokens.size(), 0);  // each token's next occurrence at or after `searched`
  for (std::size_t t = 0; t < tokens.size(); ++t) next_at[t] = text.find(tokens[t].content);
  std::size_t position = 0;
  while (true) {
    std::size_t best = std::string_view::npos;
    std::size_t best_length = 0;
    std::int32_t best_id = 0;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      if (next_at[t] != std::string_view::npos && next_at[t] < position) next_at[t] = text.find(tokens[t].content, position);
      if (next_at[t] == std::string_view::npos) continue;
      if (next_at[t] < best || (next_at[t] == best && tokens[t].content.size() > best_length)) {
        best = next_at[t];
        best_length = tokens[t].content.size();
        best_id = tokens[t].id;
      }
    }
    if (best == std::string_view::npos) break;
    encode_added_pass(text.substr(position, best - position), pass + 1, out);
    out.push_back(best_id);
    position = best + best_length;
  }
  encode_added_pass(text.substr(position), pass + 1, out);
}

std::vector<std::int32_t> ByteLevelBpe::encode(std::string_view utf8_text) {
  std::vector<std::int32_t> ids(prefix_ids_);
  encode_added_pass(utf8_text, 0, ids);
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

}  // namespace tandem::data
