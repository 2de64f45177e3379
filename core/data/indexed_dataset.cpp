// Reader and writer of Megatron's PREFIX.bin / PREFIX.idx (SPEC 2); see indexed_dataset.hpp.
// Every multi-byte field is little-endian and, after the 34-byte header, unaligned, so fields are
// read with memcpy, never through a cast pointer.
#include "core/data/indexed_dataset.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <utility>

namespace tandem::data {

static_assert(std::endian::native == std::endian::little,
              "the .idx/.bin format is little-endian; tandem reads it in place");

namespace {

std::string errno_text() { return std::strerror(errno); }

// Removes PREFIX.bin.tmp.PID and PREFIX.idx.tmp.PID files that a killed writer left: nobody holds
// their flock (a live writer does, and the operating system drops it when the writer dies) and no
// process PID runs on this host. Returns the removed paths.
std::vector<std::string> remove_abandoned_temporaries(const std::string& prefix) {
  const std::filesystem::path target(prefix);
  const std::filesystem::path parent = target.has_parent_path() ? target.parent_path() : ".";
  const std::string base = target.filename().string();
  std::vector<std::string> removed;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    std::string digits;
    for (const char* kind : {".bin.tmp.", ".idx.tmp."}) {
      if (name.starts_with(base + kind)) digits = name.substr(base.size() + std::strlen(kind));
    }
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may be running
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(entry.path().c_str()) == 0) {
      removed.push_back(entry.path().string());
    }
    ::close(fd);
  }
  return removed;
}

template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

bool is_known_code(std::uint8_t code) {
  return code >= static_cast<std::uint8_t>(TokenDtype::uint8) &&
         code <= static_cast<std::uint8_t>(TokenDtype::uint16);
}

bool is_integer_dtype(TokenDtype dtype) {
  return dtype != TokenDtype::float32 && dtype != TokenDtype::float64;
}

[[noreturn]] void fail(const std::string& file, const std::string& field, const std::string& value,
                       const std::string& expected, const std::string& fix) {
  throw DatasetError(file + ": " + field + " = " + value + "; expected " + expected +
                     "; fix: " + fix);
}

const char* const kRebuildFix =
    "rebuild the dataset (tandem data build, or Megatron's tools/preprocess_data.py)";

// Writes all of `bytes` to `fd` or throws naming `path`.
void write_all(int fd, const void* bytes, std::size_t count, const std::string& path) {
  const auto* cursor = static_cast<const unsigned char*>(bytes);
  while (count > 0) {
    const ssize_t written = ::write(fd, cursor, count);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw DatasetError(path + ": write failed: " + errno_text());
    }
    cursor += written;
    count -= static_cast<std::size_t>(written);
  }
}

void fsync_or_throw(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw DatasetError(path + ": fsync failed: " + errno_text());
}

void fsync_directory(const std::string& file_path) {
  auto directory = std::filesystem::path(file_path).parent_path();
  if (directory.empty()) directory = ".";
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some filesystems do not open directories
  ::fsync(fd);
  ::close(fd);
}

template <typename T>
void append_le(std::vector<unsigned char>& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

}  // namespace

std::size_t dtype_size(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::uint8: return 1;
    case TokenDtype::int8: return 1;
    case TokenDtype::int16: return 2;
    case TokenDtype::int32: return 4;
    case TokenDtype::int64: return 8;
    case TokenDtype::float64: return 8;
    case TokenDtype::float32: return 4;
    case TokenDtype::uint16: return 2;
  }
  throw DatasetError("dtype code " + std::to_string(static_cast<int>(dtype)) +
                     " is not in SPEC 2's table (1..8)");
}

std::string to_string(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::uint8: return "uint8";
    case TokenDtype::int8: return "int8";
    case TokenDtype::int16: return "int16";
    case TokenDtype::int32: return "int32";
    case TokenDtype::int64: return "int64";
    case TokenDtype::float64: return "float64";
    case TokenDtype::float32: return "float32";
    case TokenDtype::uint16: return "uint16";
  }
  return "code " + std::to_string(static_cast<int>(dtype));
}

TokenDtype dtype_for_vocabulary(std::int64_t vocab_size) {
  constexpr std::int64_t kUint16VocabularyLimit = 65500;  // Megatron's DType.optimal_dtype
  return vocab_size < kUint16VocabularyLimit ? TokenDtype::uint16 : TokenDtype::int32;
}

std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }
std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }

// ---- MappedFile -------------------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw DatasetError(path + ": cannot open: " + errno_text() +
                       "; fix: check the --data-path PREFIX (tandem data build writes PREFIX.bin "
                       "and PREFIX.idx)");
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    throw DatasetError(path + ": cannot stat: " + reason);
  }
  size_ = static_cast<std::size_t>(info.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      const std::string reason = errno_text();
      ::close(fd);
      throw DatasetError(path + ": mmap failed: " + reason);
    }
    data_ = static_cast<const std::byte*>(mapped);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

// ---- IndexedDataset ---------------------------------------------------------------------------

IndexedDataset IndexedDataset::open(const std::string& prefix,
                                    std::optional<TokenDtype> expected_dtype) {
  IndexedDataset dataset;
  dataset.prefix_ = prefix;
  dataset.idx_ = MappedFile(idx_path(prefix));
  dataset.bin_ = MappedFile(bin_path(prefix));
  const std::string& idx_name = dataset.idx_.path();
  const std::string& bin_name = dataset.bin_.path();
  const std::byte* idx = dataset.idx_.data();
  const std::size_t idx_size = dataset.idx_.size();

  // Header (SPEC 2): magic, version, dtype code, N, D+1.
  if (idx_size < kIndexHeaderBytes) {
    fail(idx_name, "file size", std::to_string(idx_size) + " bytes",
         "at least the " + std::to_string(kIndexHeaderBytes) + "-byte header (truncated file)",
         kRebuildFix);
  }
  if (std::memcmp(idx, kIndexMagic, kIndexMagicBytes) != 0) {
    fail(idx_name, "magic", "a different 9-byte header", "\"MMIDIDX\\0\\0\" (Megatron's .idx)",
         "point --data-path at the PREFIX of a Megatron indexed dataset");
  }
  std::size_t cursor = kIndexMagicBytes;
  const auto version = load<std::uint64_t>(idx + cursor);
  cursor += sizeof(std::uint64_t);
  if (version != kIndexVersion) {
    fail(idx_name, "version", std::to_string(version), std::to_string(kIndexVersion), kRebuildFix);
  }
  const auto code = load<std::uint8_t>(idx + cursor);
  cursor += sizeof(std::uint8_t);
  if (!is_known_code(code)) {
    fail(idx_name, "dtype code", std::to_string(code), "one of 1..8 (SPEC 2's table)", kRebuildFix);
  }
  dataset.dtype_ = static_cast<TokenDtype>(code);
  if (!is_integer_dtype(dataset.dtype_)) {
    fail(idx_name, "dtype code", std::to_string(code) + " (" + to_string(dataset.dtype_) + ")",
         "an integer token dtype", kRebuildFix);
  }
  if (expected_dtype && *expected_dtype != dataset.dtype_) {
    fail(idx_name, "dtype code",
         std::to_string(code) + " (" + to_string(dataset.dtype_) + ")",
         std::to_string(static_cast<int>(*expected_dtype)) + " (" + to_string(*expected_dtype) +
             ") (dtype mismatch)",
         "rebuild the dataset with the tokenizer this run expects");
  }
  const auto sequence_count = load<std::uint64_t>(idx + cursor);
  cursor += sizeof(std::uint64_t);
  const auto document_index_count = load<std::uint64_t>(idx + cursor);
  cursor += sizeof(std::uint64_t);

  // Sizes: int32 lengths[N], int64 offsets[N], int64 document indices[D+1], nothing after.
  const std::size_t body = idx_size - kIndexHeaderBytes;
  constexpr std::size_t kPerSequenceBytes = sizeof(std::int32_t) + sizeof(std::int64_t);
  if (sequence_count > body / kPerSequenceBytes) {
    fail(idx_name, "sequence count N", std::to_string(sequence_count),
         "at most " + std::to_string(body / kPerSequenceBytes) +
             " for a file of this size (truncated file)",
         kRebuildFix);
  }
  const std::size_t after_sequences = body - sequence_count * kPerSequenceBytes;
  if (document_index_count == 0) {
    fail(idx_name, "document-index count D+1", "0", "at least 1 (the leading 0)", kRebuildFix);
  }
  if (document_index_count > after_sequences / sizeof(std::int64_t)) {
    fail(idx_name, "document-index count D+1", std::to_string(document_index_count),
         "at most " + std::to_string(after_sequences / sizeof(std::int64_t)) +
             " for a file of this size (truncated file)",
         kRebuildFix);
  }
  const std::size_t expected_size = kIndexHeaderBytes + sequence_count * kPerSequenceBytes +
                                    document_index_count * sizeof(std::int64_t);
  if (idx_size != expected_size) {
    fail(idx_name, "file size", std::to_string(idx_size) + " bytes",
         std::to_string(expected_size) + " bytes for N = " + std::to_string(sequence_count) +
             " and D+1 = " + std::to_string(document_index_count) +
             " (trailing bytes; multimodal datasets are not supported)",
         kRebuildFix);
  }
  dataset.sequence_count_ = static_cast<std::int64_t>(sequence_count);
  dataset.document_index_count_ = static_cast<std::int64_t>(document_index_count);
  dataset.lengths_at_ = cursor;
  dataset.offsets_at_ = dataset.lengths_at_ + sequence_count * sizeof(std::int32_t);
  dataset.documents_at_ = dataset.offsets_at_ + sequence_count * sizeof(std::int64_t);

  // Sequences: non-negative lengths, contiguous offsets from 0 (as Megatron writes them), and
  // the last one ending exactly at the end of .bin.
  const auto item = static_cast<std::int64_t>(dtype_size(dataset.dtype_));
  const auto bin_size = static_cast<std::int64_t>(dataset.bin_.size());
  std::int64_t expected_offset = 0;
  for (std::int64_t i = 0; i < dataset.sequence_count_; ++i) {
    const std::int32_t length = dataset.sequence_length(i);
    const std::int64_t offset = dataset.sequence_offset(i);
    const std::string where = "[" + std::to_string(i) + "]";
    if (length < 0) {
      fail(idx_name, "lengths" + where, std::to_string(length), "a length >= 0", kRebuildFix);
    }
    if (offset != expected_offset) {
      fail(idx_name, "offsets" + where, std::to_string(offset),
           std::to_string(expected_offset) + " (the end of sequence " + std::to_string(i - 1) +
               ": offsets are contiguous byte positions, lengths x " + std::to_string(item) +
               " bytes of " + to_string(dataset.dtype_) + ")",
           kRebuildFix);
    }
    const std::int64_t end = offset + static_cast<std::int64_t>(length) * item;
    if (end > bin_size) {
      fail(idx_name, "offsets" + where + " + lengths" + where + " x " + std::to_string(item),
           std::to_string(end) + " bytes",
           "at most the size of " + bin_name + ", " + std::to_string(bin_size) +
               " bytes (offset or length past the end of .bin, or a dtype code that does not match it)",
           "rebuild the dataset; .bin and .idx must come from the same write");
    }
    expected_offset = end;
    dataset.total_tokens_ += length;
  }
  if (expected_offset != bin_size) {
    fail(bin_name, "file size", std::to_string(bin_size) + " bytes",
         std::to_string(expected_offset) + " bytes, the " + std::to_string(dataset.total_tokens_) +
             " tokens x " + std::to_string(item) + " bytes of " + to_string(dataset.dtype_) +
             " that " + idx_name + " describes (dtype mismatch or a .bin from another write)",
         "rebuild the dataset; .bin and .idx must come from the same write");
  }

  // Documents: a leading 0, non-decreasing (equal for an empty document), ending at N.
  std::int64_t previous = 0;
  for (std::int64_t j = 0; j < dataset.document_index_count_; ++j) {
    const std::int64_t value = dataset.document_index(j);
    const std::string field = "document indices[" + std::to_string(j) + "]";
    if (j == 0 && value != 0) {
      fail(idx_name, field, std::to_string(value), "0 (the leading 0)", kRebuildFix);
    }
    if (value < previous) {
      fail(idx_name, field, std::to_string(value),
           "at least " + std::to_string(previous) + ", the index before it (non-monotonic indices)",
           kRebuildFix);
    }
    if (value > dataset.sequence_count_) {
      fail(idx_name, field, std::to_string(value),
           "at most N = " + std::to_string(dataset.sequence_count_) +
               " (document index past the end)",
           kRebuildFix);
    }
    previous = value;
  }
  if (previous != dataset.sequence_count_) {
    fail(idx_name, "document indices[" + std::to_string(dataset.document_index_count_ - 1) + "]",
         std::to_string(previous),
         "N = " + std::to_string(dataset.sequence_count_) + " (every sequence in a document)",
         kRebuildFix);
  }
  return dataset;
}

std::int64_t IndexedDataset::read_idx_i64(std::size_t byte_offset) const {
  return load<std::int64_t>(idx_.data() + byte_offset);
}

std::int32_t IndexedDataset::sequence_length(std::int64_t sequence) const {
  if (sequence < 0 || sequence >= sequence_count_) {
    throw DatasetError(idx_.path() + ": sequence " + std::to_string(sequence) +
                       " is outside [0, " + std::to_string(sequence_count_) + ")");
  }
  return load<std::int32_t>(idx_.data() + lengths_at_ +
                            static_cast<std::size_t>(sequence) * sizeof(std::int32_t));
}

std::int64_t IndexedDataset::sequence_offset(std::int64_t sequence) const {
  if (sequence < 0 || sequence >= sequence_count_) {
    throw DatasetError(idx_.path() + ": sequence " + std::to_string(sequence) +
                       " is outside [0, " + std::to_string(sequence_count_) + ")");
  }
  return read_idx_i64(offsets_at_ + static_cast<std::size_t>(sequence) * sizeof(std::int64_t));
}

std::int64_t IndexedDataset::document_index(std::int64_t document) const {
  if (document < 0 || document >= document_index_count_) {
    throw DatasetError(idx_.path() + ": document index " + std::to_string(document) +
                       " is outside [0, " + std::to_string(document_index_count_) + ")");
  }
  return read_idx_i64(documents_at_ + static_cast<std::size_t>(document) * sizeof(std::int64_t));
}

void IndexedDataset::read_tokens(std::int64_t sequence, std::int64_t begin,
                                 std::span<std::int32_t> out) const {
  const std::int64_t length = sequence_length(sequence);
  const auto count = static_cast<std::int64_t>(out.size());
  if (begin < 0 || begin + count > length) {
    throw DatasetError(bin_.path() + ": tokens [" + std::to_string(begin) + ", " +
                       std::to_string(begin + count) + ") of sequence " +
                       std::to_string(sequence) + " leave its " + std::to_string(length) +
                       " tokens");
  }
  const std::size_t item = dtype_size(dtype_);
  const std::byte* at = bin_.data() + sequence_offset(sequence) +
                        static_cast<std::size_t>(begin) * item;
  auto widen = [&](std::int64_t value, std::size_t index) {
    if (value < std::numeric_limits<std::int32_t>::min() ||
        value > std::numeric_limits<std::int32_t>::max()) {
      throw DatasetError(bin_.path() + ": token " + std::to_string(begin + static_cast<std::int64_t>(index)) +
                         " of sequence " + std::to_string(sequence) + " = " +
                         std::to_string(value) + " does not fit in int32");
    }
    out[index] = static_cast<std::int32_t>(value);
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::byte* token = at + i * item;
    switch (dtype_) {
      case TokenDtype::uint8: out[i] = load<std::uint8_t>(token); break;
      case TokenDtype::int8: out[i] = load<std::int8_t>(token); break;
      case TokenDtype::int16: out[i] = load<std::int16_t>(token); break;
      case TokenDtype::uint16: out[i] = load<std::uint16_t>(token); break;
      case TokenDtype::int32: out[i] = load<std::int32_t>(token); break;
      case TokenDtype::int64: widen(load<std::int64_t>(token), i); break;
      case TokenDtype::float32:
      case TokenDtype::float64:
        throw DatasetError(bin_.path() + ": float token dtype");  // refused in open()
    }
  }
}

std::vector<std::int32_t> IndexedDataset::sequence_tokens(std::int64_t sequence) const {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(sequence_length(sequence)));
  read_tokens(sequence, 0, tokens);
  return tokens;
}

// ---- IndexedDatasetWriter ---------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(IndexedDatasetWriterConfig config)
    : config_(std::move(config)), dtype_(dtype_for_vocabulary(config_.vocab_size)) {
  if (config_.vocab_size < 1) {
    throw DatasetError("vocab_size = " + std::to_string(config_.vocab_size) +
                       "; expected at least 1; fix: give the tokenizer's vocabulary size");
  }
  if (config_.append_eod && (config_.eod_token < 0 || config_.eod_token >= config_.vocab_size)) {
    throw DatasetError("eod_token = " + std::to_string(config_.eod_token) + "; expected in [0, " +
                       std::to_string(config_.vocab_size) + "); fix: use the tokenizer's EOD id");
  }
  const auto parent = std::filesystem::path(config_.prefix).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    throw DatasetError("--output-prefix " + config_.prefix + ": directory " + parent.string() +
                       " does not exist; fix: create it first");
  }
  for (const auto& leftover : remove_abandoned_temporaries(config_.prefix)) {
    std::cerr << "note: removed " << leftover << ", left by a dataset write that was killed (no process holds it)\n";
  }
  const std::string unique = ".tmp." + std::to_string(::getpid());
  bin_temp_ = bin_path(config_.prefix) + unique;
  idx_temp_ = idx_path(config_.prefix) + unique;
  bin_fd_ = ::open(bin_temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (bin_fd_ < 0) throw DatasetError(bin_temp_ + ": cannot create: " + errno_text());
  if (::flock(bin_fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string reason = errno_text();
    ::close(bin_fd_);
    bin_fd_ = -1;
    throw DatasetError(bin_temp_ + ": cannot lock (" + reason + "); another tandem process with this PID writes " +
                       config_.prefix + "?");
  }
  document_indices_.push_back(0);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) discard();
}

void IndexedDatasetWriter::discard() noexcept {
  if (bin_fd_ >= 0) {
    ::close(bin_fd_);
    bin_fd_ = -1;
  }
  ::unlink(bin_temp_.c_str());
  ::unlink(idx_temp_.c_str());
}

void IndexedDatasetWriter::write_bin(const void* bytes, std::size_t count) {
  write_all(bin_fd_, bytes, count, bin_temp_);
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens) {
  add_document_pieces(std::vector<std::span<const std::int32_t>>{tokens});
}

void IndexedDatasetWriter::add_document_pieces(const std::vector<std::span<const std::int32_t>>& pieces) {
  if (finished_) throw DatasetError(config_.prefix + ": add_document after finish()");
  // Megatron's preprocess_data.py: every non-empty piece is one sequence, the EOD ends the last.
  std::size_t last_non_empty = pieces.size();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i].empty()) last_non_empty = i;
  }
  if (last_non_empty == pieces.size()) {
    // SPEC 2: an empty document is recorded with no tokens and no sequence (Megatron's
    // add_document with no lengths appends a repeated document index).
    ++empty_documents_;
    document_indices_.push_back(static_cast<std::int64_t>(lengths_.size()));
    return;
  }
  for (std::size_t i = 0; i <= last_non_empty; ++i) {
    if (!pieces[i].empty()) append_sequence(pieces[i], config_.append_eod && i == last_non_empty);
  }
  document_indices_.push_back(static_cast<std::int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::append_sequence(std::span<const std::int32_t> tokens, bool append_eod) {
  const std::size_t with_eod = tokens.size() + (append_eod ? 1 : 0);
  if (with_eod > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw DatasetError(config_.prefix + ": a document of " + std::to_string(with_eod) +
                       " tokens exceeds the int32 length field of .idx; fix: split it");
  }
  const std::size_t item = dtype_size(dtype_);
  encode_buffer_.clear();
  encode_buffer_.reserve(with_eod * item);
  auto encode = [&](std::int32_t token, std::size_t index) {
    if (token < 0 || token >= config_.vocab_size) {
      throw DatasetError(config_.prefix + ": document " +
                         std::to_string(document_indices_.size() - 1) + " token " +
                         std::to_string(index) + " = " + std::to_string(token) +
                         "; expected in [0, " + std::to_string(config_.vocab_size) +
                         "); fix: check the tokenizer's vocabulary size");
    }
    if (dtype_ == TokenDtype::uint16) {
      append_le(encode_buffer_, static_cast<std::uint16_t>(token));
    } else {
      append_le(encode_buffer_, token);
    }
  };
  for (std::size_t i = 0; i < tokens.size(); ++i) encode(tokens[i], i);
  if (append_eod) encode(config_.eod_token, tokens.size());
  write_bin(encode_buffer_.data(), encode_buffer_.size());
  lengths_.push_back(static_cast<std::int32_t>(with_eod));
  tokens_ += static_cast<std::int64_t>(with_eod);
}

IndexedDatasetSummary IndexedDatasetWriter::finish() {
  if (finished_) throw DatasetError(config_.prefix + ": finish() called twice");
  try {
    // Both temporaries stay open, and so locked, until they are renamed into place.
    fsync_or_throw(bin_fd_, bin_temp_);

    // The .idx of SPEC 2, in order.
    std::vector<unsigned char> index;
    index.insert(index.end(), kIndexMagic, kIndexMagic + kIndexMagicBytes);
    append_le(index, kIndexVersion);
    append_le(index, static_cast<std::uint8_t>(dtype_));
    append_le(index, static_cast<std::uint64_t>(lengths_.size()));
    append_le(index, static_cast<std::uint64_t>(document_indices_.size()));
    for (std::int32_t length : lengths_) append_le(index, length);
    std::int64_t offset = 0;
    const auto item = static_cast<std::int64_t>(dtype_size(dtype_));
    for (std::int32_t length : lengths_) {
      append_le(index, offset);
      offset += static_cast<std::int64_t>(length) * item;
    }
    for (std::int64_t document : document_indices_) append_le(index, document);

    const int idx_fd = ::open(idx_temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (idx_fd < 0) throw DatasetError(idx_temp_ + ": cannot create: " + errno_text());
    const std::string bin_final = bin_path(config_.prefix);
    const std::string idx_final = idx_path(config_.prefix);
    try {
      if (::flock(idx_fd, LOCK_EX | LOCK_NB) != 0) throw DatasetError(idx_temp_ + ": cannot lock: " + errno_text());
      write_all(idx_fd, index.data(), index.size(), idx_temp_);
      fsync_or_throw(idx_fd, idx_temp_);
      // Old .idx out first, then .bin, then .idx: never a new .bin under an old .idx.
      if (::unlink(idx_final.c_str()) != 0 && errno != ENOENT) {
        throw DatasetError(idx_final + ": cannot replace: " + errno_text());
      }
      if (::rename(bin_temp_.c_str(), bin_final.c_str()) != 0) {
        throw DatasetError(bin_final + ": rename failed: " + errno_text());
      }
      if (::rename(idx_temp_.c_str(), idx_final.c_str()) != 0) {
        throw DatasetError(idx_final + ": rename failed: " + errno_text());
      }
    } catch (...) {
      ::close(idx_fd);
      throw;
    }
    const bool idx_closed = ::close(idx_fd) == 0;
    const bool bin_closed = ::close(bin_fd_) == 0;
    bin_fd_ = -1;
    if (!idx_closed || !bin_closed) throw DatasetError(config_.prefix + ": close failed: " + errno_text());
    fsync_directory(idx_final);
    finished_ = true;

    IndexedDatasetSummary summary;
    summary.documents = static_cast<std::int64_t>(document_indices_.size()) - 1;
    summary.empty_documents = empty_documents_;
    summary.sequences = static_cast<std::int64_t>(lengths_.size());
    summary.tokens = tokens_;
    summary.dtype = dtype_;
    summary.bin_path = bin_final;
    summary.idx_path = idx_final;
    return summary;
  } catch (...) {
    discard();
    finished_ = true;
    throw;
  }
}

}  // namespace tandem::data
