// A SentencePiece .model file (Megatron's --tokenizer-model for SentencePieceTokenizer and
// Llama2Tokenizer), read with Debian's libsentencepiece: its pieces, its special ids and its
// encoder, the way Megatron's wrappers call the Python sentencepiece package (docs/DATA.md
// section 13). The library stays behind this interface: tandem_core links it privately.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::data {

class SentencePieceModel {
 public:
  // Loads `path`; throws ConfigError (core/config_issue.hpp) on `option` = path for a missing file or one
  // that is not a SentencePiece model, naming the rule and the fix.
  static SentencePieceModel load(const std::string& path, const std::string& option);
  SentencePieceModel(SentencePieceModel&&) noexcept;
  SentencePieceModel& operator=(SentencePieceModel&&) noexcept;
  ~SentencePieceModel();

  const std::string& path() const { return path_; }
  std::int64_t piece_count() const;           // get_piece_size(): ids are [0, piece_count)
  const std::string& piece(std::int32_t id) const;  // id_to_piece(id), id in [0, piece_count)
  // The model's special ids as its trainer spec sets them; -1 when the model has none
  // (sentencepiece's bos_id(), eos_id(), pad_id(), unk_id()).
  std::int32_t bos_id() const;
  std::int32_t eos_id() const;
  std::int32_t pad_id() const;
  std::int32_t unk_id() const;
  // encode_as_ids(text): the model's normalizer, pre-tokenization and segmentation, with no
  // sampling; valid UTF-8 in.
  std::vector<std::int32_t> encode(const std::string& utf8_text) const;

 private:
  struct Impl;
  SentencePieceModel(std::string path, std::unique_ptr<Impl> impl);
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::data
