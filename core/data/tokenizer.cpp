// Special ids and vocabulary sizes of Megatron's tokenizers (see tokenizer.hpp; the readings of
// Megatron's classes are in docs/DATA.md section 13).
#include "core/data/tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config_issue.hpp"
#include "core/data/sentencepiece_model.hpp"

namespace tandem::data {
namespace {

[[noreturn]] void refuse(std::string field, std::string value, std::string rule, std::string fix) {
  throw ConfigError({ConfigIssue{std::move(field), std::move(value), std::move(rule), std::move(fix)}});
}

std::int32_t checked_id(const nlohmann::json& id, const std::string& token, const std::string& field,
                        const std::string& value, const std::string& fix) {
  if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
      id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
    refuse(field, value, "token " + nlohmann::json(token).dump() + " has id " + id.dump() +
                             "; expected an integer in [0, 2^31)", fix);
  }
  return id.get<std::int32_t>();
}

// Megatron's vocabulary size is the count of tokens (len(encoder), len(tokenizer)); the
// embedding has that many rows, so every id must lie below it.
void require_dense(const std::map<std::string, std::int32_t>& vocab, const std::string& field,
                   const std::string& value, const std::string& fix) {
  for (const auto& [token, id] : vocab) {
    if (static_cast<std::int64_t>(id) >= static_cast<std::int64_t>(vocab.size())) {
      refuse(field, value, "token " + nlohmann::json(token).dump() + " has id " + std::to_string(id) +
                               ", not below the vocabulary's " + std::to_string(vocab.size()) +
                               " tokens (Megatron's vocabulary size is the token count)", fix);
    }
  }
}

// _GPT2BPETokenizer: vocab_size = len(encoder) (the vocab.json object), eod =
// encoder['<|endoftext|>'], no pad (GPTDataset falls back to -1). Megatron asserts both files
// are given; the merges are not needed for the ids, only their presence is checked.
TokenizerIds gpt2_ids(const TokenizerConfig& tokenizer) {
  const std::string fix_vocab = "give --vocab-file the GPT-2 vocab.json the dataset was built with";
  if (tokenizer.vocab_file.empty()) {
    refuse("--vocab-file", "not given", "--tokenizer-type GPT2BPETokenizer reads its vocabulary from vocab.json",
           fix_vocab);
  }
  if (tokenizer.merge_file.empty()) {
    refuse("--merge-file", "not given", "--tokenizer-type GPT2BPETokenizer needs its merges file, as Megatron asserts",
           "give --merge-file the GPT-2 merges.txt beside the vocab.json");
  }
  if (!std::filesystem::is_regular_file(tokenizer.merge_file)) {
    refuse("--merge-file", tokenizer.merge_file, "is not a readable file", "give the path of the GPT-2 merges.txt");
  }
  const nlohmann::json encoder = read_option_json(tokenizer.vocab_file, "--vocab-file", tokenizer.vocab_file, fix_vocab);
  if (!encoder.is_object() || encoder.empty()) {
    refuse("--vocab-file", tokenizer.vocab_file, "must hold one non-empty JSON object of token -> id", fix_vocab);
  }
  std::map<std::string, std::int32_t> vocab;
  for (const auto& [token, id] : encoder.items()) {
    vocab[token] = checked_id(id, token, "--vocab-file", tokenizer.vocab_file, fix_vocab);
  }
  require_dense(vocab, "--vocab-file", tokenizer.vocab_file, fix_vocab);
  const auto eod = vocab.find("<|endoftext|>");
  if (eod == vocab.end()) {
    refuse("--vocab-file", tokenizer.vocab_file,
           "holds no \"<|endoftext|>\", the token Megatron's GPT2BPETokenizer takes as EOD",
           "give GPT-2's vocab.json (its EOD is \"<|endoftext|>\"), or name the tokenizer the data was "
           "built with");
  }
  return {static_cast<std::int64_t>(vocab.size()), eod->second, kNoPadToken};
}

// A special token as tokenizer_config.json or special_tokens_map.json spell it: a string, or an
// object whose "content" is the string (transformers' AddedToken); null or absent: none.
std::optional<std::string> special_token(const nlohmann::json& settings, const char* key) {
  if (!settings.is_object() || !settings.contains(key) || settings.at(key).is_null()) return std::nullopt;
  const nlohmann::json& value = settings.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  return std::nullopt;
}

// _HuggingFaceTokenizer (transformers' AutoTokenizer): vocab_size = len(tokenizer), the model's
// vocabulary with the added tokens (distinct tokens); eod = eos_token_id; pad = pad_token_id (none
// when unset: GPTDataset's -1). Read from DIR/tokenizer.json and DIR/tokenizer_config.json,
// falling back to DIR/special_tokens_map.json for the special tokens, as transformers does.
TokenizerIds huggingface_ids(const TokenizerConfig& tokenizer) {
  const std::string& dir = tokenizer.tokenizer_model;
  const std::string fix = "give --tokenizer-model a local directory holding the tokenizer's tokenizer.json and "
                          "tokenizer_config.json (as saved by save_pretrained)";
  if (dir.empty()) {
    refuse("--tokenizer-model", "not given", "--tokenizer-type HuggingFaceTokenizer reads a tokenizer directory", fix);
  }
  if (!std::filesystem::is_directory(dir)) {
    refuse("--tokenizer-model", dir, "is not a directory (tandem reads no hub names)", fix);
  }
  const std::filesystem::path root(dir);
  const nlohmann::json definition = read_option_json(root / "tokenizer.json", "--tokenizer-model", dir, fix);
  std::map<std::string, std::int32_t> vocab;
  const nlohmann::json* model_vocab = nullptr;
  if (definition.is_object() && definition.contains("model") && definition.at("model").is_object() &&
      definition.at("model").contains("vocab")) {
    model_vocab = &definition.at("model").at("vocab");
  }
  if (model_vocab == nullptr) {
    refuse("--tokenizer-model", dir, "tokenizer.json has no model.vocab", fix);
  }
  if (model_vocab->is_object()) {  // BPE, WordPiece, WordLevel: token -> id
    for (const auto& [token, id] : model_vocab->items()) vocab[token] = checked_id(id, token, "--tokenizer-model", dir, fix);
  } else if (model_vocab->is_array()) {  // Unigram: [[piece, score], ...], id = index
    std::int32_t id = 0;
    for (const auto& entry : *model_vocab) {
      if (!entry.is_array() || entry.empty() || !entry.at(0).is_string()) {
        refuse("--tokenizer-model", dir, "tokenizer.json's Unigram vocab entry " + std::to_string(id) +
                                             " is not [piece, score]", fix);
      }
      vocab[entry.at(0).get<std::string>()] = id++;
    }
  } else {
    refuse("--tokenizer-model", dir, "tokenizer.json's model.vocab is neither an object nor a list", fix);
  }
  if (definition.contains("added_tokens") && definition.at("added_tokens").is_array()) {
    for (const auto& added : definition.at("added_tokens")) {
      if (!added.is_object() || !added.contains("content") || !added.at("content").is_string() ||
          !added.contains("id")) {
        refuse("--tokenizer-model", dir, "an added_tokens entry of tokenizer.json lacks content or id", fix);
      }
      const std::string token = added.at("content").get<std::string>();
      vocab[token] = checked_id(added.at("id"), token, "--tokenizer-model", dir, fix);
    }
  }
  require_dense(vocab, "--tokenizer-model", dir, fix);

  const std::filesystem::path config_path = root / "tokenizer_config.json";
  const std::filesystem::path map_path = root / "special_tokens_map.json";
  const nlohmann::json config = std::filesystem::exists(config_path)
                                    ? read_option_json(config_path, "--tokenizer-model", dir, fix)
                                    : nlohmann::json::object();
  const nlohmann::json map = std::filesystem::exists(map_path) ? read_option_json(map_path, "--tokenizer-model", dir, fix)
                                                               : nlohmann::json::object();
  const auto lookup = [&](const char* key) -> std::optional<std::string> {
    if (auto token = special_token(config, key)) return token;
    return special_token(map, key);
  };
  const auto id_of = [&](const std::string& token, const char* key) {
    const auto found = vocab.find(token);
    if (found == vocab.end()) {
      refuse("--tokenizer-model", dir, std::string(key) + " " + nlohmann::json(token).dump() +
                                           " is not in tokenizer.json's vocabulary or added tokens", fix);
    }
    return found->second;
  };
  // Megatron Core 0.19's HuggingFaceTokenizer: a tokenizer without eos_token but with a
  // sep_token takes the SEP as its EOS.
  auto eos = lookup("eos_token");
  if (!eos) eos = lookup("sep_token");
  if (!eos) {
    refuse("--tokenizer-model", dir,
           "names no eos_token (nor sep_token) in tokenizer_config.json or special_tokens_map.json; Megatron's "
           "HuggingFaceTokenizer takes EOD from the EOS token",
           "set eos_token in tokenizer_config.json to the token that ends each document");
  }
  const std::int32_t eod = id_of(*eos, "eos_token");
  const auto pad = lookup("pad_token");
  return {static_cast<std::int64_t>(vocab.size()), eod, pad ? id_of(*pad, "pad_token") : kNoPadToken};
}

// SentencePieceTokenizer and Llama2Tokenizer as Megatron Core 0.19 builds both (and 0.16.1
// without --legacy-tokenizer): its SentencePiece library wrapper, not legacy, so
// vocab_size = get_piece_size() (no pieces added), eod = eos_id() (no eod_id: the EOS stands in),
// pad = pad_id() (-1, none, unless the model was trained with one). docs/DATA.md section 13.
TokenizerIds sentencepiece_ids(const TokenizerConfig& tokenizer) {
  const SentencePieceModel model = SentencePieceModel::load(tokenizer.tokenizer_model, "--tokenizer-model");
  if (model.eos_id() < 0) {
    refuse("--tokenizer-model", tokenizer.tokenizer_model,
           "the model has no EOS piece (eos_id -1), and Megatron's " + to_string(tokenizer.type) +
               " takes the end-of-document id from it",
           "use a model trained with an EOS (sentencepiece's eos_id >= 0), the one the data was built with");
  }
  return {model.piece_count(), model.eos_id(), model.pad_id() < 0 ? kNoPadToken : model.pad_id()};
}

TokenizerIds read_ids(const TokenizerConfig& tokenizer, const NullTokenizerOptions& null);

}  // namespace

nlohmann::json read_option_json(const std::filesystem::path& path, const std::string& field, const std::string& value,
                                const std::string& fix) {
  std::ifstream input(path);
  if (!input) refuse(field, value, "cannot open " + path.string(), fix);
  try {
    return nlohmann::json::parse(input);
  } catch (const nlohmann::json::parse_error& error) {
    refuse(field, value, path.string() + " is not valid JSON (" + error.what() + ")", fix);
  }
}

std::optional<TokenizerType> parse_tokenizer_type(const std::string& name) {
  for (const TokenizerType type : {TokenizerType::bytes, TokenizerType::gpt2_bpe, TokenizerType::huggingface,
                                   TokenizerType::sentencepiece, TokenizerType::llama2,
                                   TokenizerType::null_tokenizer}) {
    if (name == to_string(type)) return type;
  }
  return std::nullopt;
}

TokenizerIds read_tokenizer_ids(const TokenizerConfig& tokenizer, const NullTokenizerOptions& null) {
  TokenizerIds ids = read_ids(tokenizer, null);
  // Megatron Core 0.19's MegatronDataset: a PAD that collides with EOD is reset to -1, so no
  // document end is ever masked as padding (tandem has no --allow-ambiguous-pad-tokens).
  if (ids.pad_token == ids.eod_token) ids.pad_token = kNoPadToken;
  return ids;
}

namespace {

TokenizerIds read_ids(const TokenizerConfig& tokenizer, const NullTokenizerOptions& null) {
  switch (tokenizer.type) {
    case TokenizerType::bytes:
      return {};
    case TokenizerType::gpt2_bpe:
      return gpt2_ids(tokenizer);
    case TokenizerType::huggingface:
      return huggingface_ids(tokenizer);
    case TokenizerType::null_tokenizer: {
      // Megatron Core 0.19's NullTokenizer(vocab_size, eod_id, pad_id): vocab_size ids, EOD
      // --null-tokenizer-eod-id or vocab_size - 1, PAD --null-tokenizer-pad-id (default -1: none).
      const std::int64_t vocab = null.vocab_size;
      if (vocab < 1 || vocab > std::numeric_limits<std::int32_t>::max()) {
        refuse("--vocab-size", std::to_string(vocab), "NullTokenizer's vocabulary; expected 1 <= size < 2^31",
               "give the number of ids the data uses, EOD included");
      }
      const std::int64_t eod = null.eod_id.value_or(vocab - 1);
      if (eod < 0 || eod >= vocab) {
        refuse("--null-tokenizer-eod-id", std::to_string(eod),
               "must be an id of the vocabulary, in [0, " + std::to_string(vocab) + ") (--vocab-size)",
               "give the data's EOD id, or leave it out for --vocab-size - 1");
      }
      if (null.pad_id != kNoPadToken && (null.pad_id < 0 || null.pad_id >= vocab)) {
        refuse("--null-tokenizer-pad-id", std::to_string(null.pad_id),
               "must be -1 (no padding token) or an id in [0, " + std::to_string(vocab) + ")",
               "give the data's padding id, or leave it out");
      }
      return {vocab, static_cast<std::int32_t>(eod), static_cast<std::int32_t>(null.pad_id)};
    }
    case TokenizerType::sentencepiece:
    case TokenizerType::llama2:
      return sentencepiece_ids(tokenizer);
  }
  refuse("--tokenizer-type", "?", "unknown type", "name a supported type");
}

}  // namespace

std::string tokenizer_summary(const TokenizerConfig& tokenizer, std::int64_t vocab_size) {
  std::string out = tokenizer.named() ? to_string(tokenizer.type) : "bytes (tandem's byte tokenizer)";
  out += ": EOD " + std::to_string(tokenizer.eod_token) + ", PAD " +
         (tokenizer.pad_token == kNoPadToken ? std::string("none") : std::to_string(tokenizer.pad_token)) + ", " +
         std::to_string(vocab_size) + " ids";
  return out;
}

}  // namespace tandem::data
