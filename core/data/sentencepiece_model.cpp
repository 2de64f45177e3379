// libsentencepiece behind tandem's interface (see sentencepiece_model.hpp).
#include "core/data/sentencepiece_model.hpp"

#include <filesystem>
#include <stdexcept>

#include <sentencepiece_processor.h>

#include "core/config_issue.hpp"

namespace tandem::data {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceModel::SentencePieceModel(std::string path, std::unique_ptr<Impl> impl)
    : path_(std::move(path)), impl_(std::move(impl)) {}
SentencePieceModel::SentencePieceModel(SentencePieceModel&&) noexcept = default;
SentencePieceModel& SentencePieceModel::operator=(SentencePieceModel&&) noexcept = default;
SentencePieceModel::~SentencePieceModel() = default;

SentencePieceModel SentencePieceModel::load(const std::string& path, const std::string& option) {
  const std::string fix = "give " + option + " the tokenizer's SentencePiece .model file (e.g. Llama 2's "
                          "tokenizer.model), the one the data was built with";
  const auto refuse = [&](const std::string& value, const std::string& rule) {
    throw ConfigError({ConfigIssue{option, value, rule, fix}});
  };
  if (path.empty()) refuse("not given", "SentencePieceTokenizer and Llama2Tokenizer read a .model file");
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) refuse(path, "is not a readable file");
  auto impl = std::make_unique<Impl>();
  const auto status = impl->processor.Load(path);
  if (!status.ok()) {
    refuse(path, "is not a SentencePiece model (libsentencepiece: " + status.ToString() + ")");
  }
  if (impl->processor.GetPieceSize() < 1) refuse(path, "holds no pieces");
  return SentencePieceModel(path, std::move(impl));
}

std::int64_t SentencePieceModel::piece_count() const { return impl_->processor.GetPieceSize(); }

const std::string& SentencePieceModel::piece(std::int32_t id) const {
  if (id < 0 || id >= piece_count()) throw std::out_of_range("SentencePiece id " + std::to_string(id));
  return impl_->processor.IdToPiece(id);
}

std::int32_t SentencePieceModel::bos_id() const { return impl_->processor.bos_id(); }
std::int32_t SentencePieceModel::eos_id() const { return impl_->processor.eos_id(); }
std::int32_t SentencePieceModel::pad_id() const { return impl_->processor.pad_id(); }
std::int32_t SentencePieceModel::unk_id() const { return impl_->processor.unk_id(); }

std::vector<std::int32_t> SentencePieceModel::encode(const std::string& utf8_text) const {
  std::vector<int> ids;
  const auto status = impl_->processor.Encode(utf8_text, &ids);
  if (!status.ok()) throw std::runtime_error("SentencePiece encode failed (" + path_ + "): " + status.ToString());
  return {ids.begin(), ids.end()};
}

}  // namespace tandem::data
