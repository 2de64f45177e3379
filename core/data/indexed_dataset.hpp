// Megatron's indexed dataset on disk (SPEC 2): a PREFIX.bin of concatenated tokens and a
// PREFIX.idx describing its sequences and documents. The reader memory-maps both files, checks
// every field once when opening, and refuses bad input with an error naming the file, the field,
// the value and what was expected. The writer produces files Megatron loads, atomically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace tandem::data {

// A dataset file that cannot be used as it is. The message names the file, the field, the value,
// the rule and the fix.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The dtype codes of Megatron's .idx header (SPEC 2).
enum class TokenDtype : std::uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

// Bytes per token of a dtype; throws for a code outside the table.
std::size_t dtype_size(TokenDtype dtype);
// "uint16" etc.
std::string to_string(TokenDtype dtype);
// Megatron's choice (DType.optimal_dtype): uint16 when the vocabulary is below 65,500, else int32.
TokenDtype dtype_for_vocabulary(std::int64_t vocab_size);

// The fixed layout of the .idx header (SPEC 2), in bytes.
inline constexpr char kIndexMagic[] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::size_t kIndexMagicBytes = sizeof(kIndexMagic);  // 9
inline constexpr std::uint64_t kIndexVersion = 1;
// magic 9 + version 8 + dtype code 1 + sequence count 8 + document-index count 8.
inline constexpr std::size_t kIndexHeaderBytes = kIndexMagicBytes + 8 + 1 + 8 + 8;  // 34

std::string bin_path(const std::string& prefix);  // PREFIX.bin
std::string idx_path(const std::string& prefix);  // PREFIX.idx

// A read-only memory map of one whole file (POSIX mmap). Move-only; unmaps on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// A validated, memory-mapped PREFIX.bin / PREFIX.idx pair. Sequence i's tokens are
// lengths[i] tokens at byte offset offsets[i] of .bin; documents are ranges of sequences
// [document_index(j), document_index(j+1)). For GPT training each sequence is one unit of the
// sample stream (Megatron splits and shuffles by sequence).
class IndexedDataset {
 public:
  // Opens and validates PREFIX.idx and PREFIX.bin. `expected_dtype`, when given, must match the
  // header's dtype code. Throws DatasetError naming the file, field, value and expectation.
  static IndexedDataset open(const std::string& prefix,
                             std::optional<TokenDtype> expected_dtype = std::nullopt);

  const std::string& prefix() const { return prefix_; }
  TokenDtype dtype() const { return dtype_; }
  std::int64_t sequence_count() const { return sequence_count_; }            // N
  std::int64_t document_count() const { return document_index_count_ - 1; }  // D
  std::int64_t total_tokens() const { return total_tokens_; }

  std::int32_t sequence_length(std::int64_t sequence) const;   // tokens, >= 0
  std::int64_t sequence_offset(std::int64_t sequence) const;   // bytes into .bin
  std::int64_t document_index(std::int64_t document) const;    // document in [0, D]

  // Copies tokens [begin, begin + out.size()) of `sequence` into `out`, widened to int32.
  // Throws when the range leaves the sequence or a token does not fit in int32.
  void read_tokens(std::int64_t sequence, std::int64_t begin, std::span<std::int32_t> out) const;
  std::vector<std::int32_t> sequence_tokens(std::int64_t sequence) const;  // [length]

 private:
  IndexedDataset() = default;
  std::int64_t read_idx_i64(std::size_t byte_offset) const;

  std::string prefix_;
  MappedFile idx_;
  MappedFile bin_;
  TokenDtype dtype_ = TokenDtype::uint16;
  std::int64_t sequence_count_ = 0;
  std::int64_t document_index_count_ = 1;
  std::int64_t total_tokens_ = 0;
  std::size_t lengths_at_ = 0;    // byte offset of int32 lengths[N] in .idx
  std::size_t offsets_at_ = 0;    // byte offset of int64 offsets[N] in .idx
  std::size_t documents_at_ = 0;  // byte offset of int64 document indices[D+1] in .idx
};

// What the writer produces; see IndexedDatasetWriter.
struct IndexedDatasetWriterConfig {
  std::string prefix;                               // writes PREFIX.bin and PREFIX.idx
  std::int64_t vocab_size = kByteVocabularySize;    // token ids lie in [0, vocab); picks the dtype
  std::int32_t eod_token = kEodToken;               // appended to every non-empty document
  bool append_eod = true;                           // Megatron's --append-eod (SPEC 2: on)
};

// What a finished write holds.
struct IndexedDatasetSummary {
  std::int64_t documents = 0;        // documents recorded, empty ones included
  std::int64_t empty_documents = 0;  // documents with no tokens (no sequence recorded)
  std::int64_t sequences = 0;        // N: one per non-empty document (or per non-empty piece)
  std::int64_t tokens = 0;           // tokens in .bin, EODs included
  TokenDtype dtype = TokenDtype::uint16;
  std::string bin_path;
  std::string idx_path;
};

// Writes a dataset atomically: tokens stream into temporary files beside the targets; finish()
// fsyncs them, removes the old PREFIX.idx, renames .bin then .idx into place and fsyncs the
// directory. An interrupted or failed write therefore leaves the old pair, or no .idx at all
// (which the reader refuses), never a new .bin described by an old .idx. Destroying an
// unfinished writer removes its temporaries. The writer holds an flock on each temporary while it
// exists, so the next writer of PREFIX can tell a killed writer's temporaries from a live one's: it
// removes those nobody holds whose PID does not run on this host, and says so on stderr.
class IndexedDatasetWriter {
 public:
  explicit IndexedDatasetWriter(IndexedDatasetWriterConfig config);
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;
  ~IndexedDatasetWriter();

  // One document (SPEC 2): a non-empty one becomes one sequence with EOD appended; an empty one
  // adds a document boundary with no sequence and no tokens, as Megatron's add_document([], []).
  void add_document(std::span<const std::int32_t> tokens);
  // One document given in pieces, as Megatron's preprocess_data.py writes a list-valued "text" (or
  // split sentences): each non-empty piece becomes one sequence, the EOD is appended to the last;
  // a document whose pieces are all empty is recorded as an empty document.
  void add_document_pieces(const std::vector<std::span<const std::int32_t>>& pieces);
  IndexedDatasetSummary finish();

 private:
  void append_sequence(std::span<const std::int32_t> tokens, bool append_eod);
  void write_bin(const void* bytes, std::size_t count);
  void discard() noexcept;

  IndexedDatasetWriterConfig config_;
  TokenDtype dtype_;
  std::string bin_temp_;
  std::string idx_temp_;
  int bin_fd_ = -1;
  bool finished_ = false;
  std::vector<std::int32_t> lengths_;          // [N]
  std::vector<std::int64_t> document_indices_; // [D+1], leading 0
  std::int64_t tokens_ = 0;
  std::int64_t empty_documents_ = 0;
  std::vector<unsigned char> encode_buffer_;
};

}  // namespace tandem::data
