// --data-cache-path for Megatron's GPTDataset indices (megatron_order.hpp; docs/DATA.md section
// 4): the cache file's format, its atomic write under a lock, and its memory-mapped, validated
// load. Megatron caches its indices as .npy files named by a hash of the dataset's description;
// tandem does the same with one file of its own format per index.
//
// File: DIR/tandem-gpt-index-<16 hex digits>.bin, the digits the FNV-1a hash of the description
// (a JSON text naming the dataset, the split's sequences and their lengths' hash, --seq-length,
// num_samples and --seed). Host byte order; each part starts on 8 bytes, zero-padded:
//   CacheHeader | description | document index int32 [entries] | document starts int64
//   [entries + 1] | shuffle index uint32 or int64 [samples]
// CacheHeader::checksum covers every byte after the header, so truncation and flipped bits are
// found; a file that does not validate is never used, and is rebuilt.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/data/megatron_order.hpp"

namespace tandem::data {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'G', 'P', 'T', 'I'};
constexpr std::uint64_t kFormatVersion = 1;

struct CacheHeader {
  char magic[8];                     // kMagic
  std::uint64_t version;             // kFormatVersion
  std::uint64_t description_bytes;   // the description's length, before padding
  std::int64_t tokens_per_epoch;     // E
  std::int64_t epochs;
  std::int64_t separate_final_epoch;  // 0 or 1
  std::int64_t sample_count;
  std::uint64_t entries;             // document index entries: epochs x sequences
  std::uint64_t shuffle_width;       // bytes per shuffle entry: 4 (uint32) or 8 (int64)
  std::uint64_t checksum;            // over every byte after the header
  std::uint64_t file_bytes;          // the whole file
};
static_assert(sizeof(CacheHeader) % 8 == 0);

constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ULL;

std::uint64_t padded(std::uint64_t bytes) { return (bytes + 7) / 8 * 8; }

// Byte offsets of the parts, from the header's counts.
struct Layout {
  std::uint64_t description = sizeof(CacheHeader);
  std::uint64_t document_index = 0;
  std::uint64_t document_starts = 0;
  std::uint64_t shuffle = 0;
  std::uint64_t end = 0;
};
Layout layout_of(std::uint64_t description_bytes, std::uint64_t entries, std::uint64_t samples,
                 std::uint64_t shuffle_width) {
  Layout layout;
  layout.document_index = layout.description + padded(description_bytes);
  layout.document_starts = layout.document_index + padded(entries * sizeof(std::int32_t));
  layout.shuffle = layout.document_starts + (entries + 1) * sizeof(std::int64_t);
  layout.end = layout.shuffle + padded(samples * shuffle_width);
  return layout;
}

// FNV-1a over 64-bit words (each word one step: any change of one word changes the result); a
// tail shorter than a word is read as if zero-padded, as the file pads it.
void mix(std::uint64_t& hash, const void* data, std::uint64_t bytes) {
  const auto* at = static_cast<const unsigned char*>(data);
  std::uint64_t word = 0;
  for (; bytes >= 8; bytes -= 8, at += 8) {
    std::memcpy(&word, at, 8);
    hash = (hash ^ word) * kFnvPrime;
  }
  if (bytes > 0) {
    word = 0;
    std::memcpy(&word, at, bytes);
    hash = (hash ^ word) * kFnvPrime;
  }
}

std::string hex64(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string seconds_text(std::chrono::steady_clock::time_point start) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char text[32];
  std::snprintf(text, sizeof text, "%.3f s", seconds);
  return text;
}

[[noreturn]] void fail_io(const std::string& what, const std::string& path, int error) {
  throw DatasetError("--data-cache-path: cannot " + what + " " + path + ": " + std::strerror(error) +
                     "; fix: give a writable directory, or drop --data-cache-path to build the "
                     "indices in memory");
}

// An exclusive flock(2) on PATH, held for the object's life: between processes and between
// threads (each lock opens its own file description).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    descriptor_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (descriptor_ < 0) fail_io("create the lock file", path, errno);
    while (::flock(descriptor_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int error = errno;
        ::close(descriptor_);
        fail_io("lock", path, error);
      }
    }
  }
  ~FileLock() { ::close(descriptor_); }  // closing releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int descriptor_ = -1;
};

// A read-only mapping of a whole file, unmapped when the last user lets go.
struct Mapping {
  void* base = nullptr;
  std::size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
};

// Writes `parts` (pointer, bytes) after `header` to a temporary file beside `path`, syncs it and
// renames it onto `path`: a reader sees the old file or the whole new one, never a partial one.
void write_atomically(const std::string& path, const CacheHeader& header,
                      const std::vector<std::pair<const void*, std::uint64_t>>& parts) {
  std::ostringstream unique;
  unique << path << ".tmp." << ::getpid() << "." << std::hash<std::thread::id>{}(std::this_thread::get_id());
  const std::string temporary = unique.str();
  const int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (descriptor < 0) fail_io("create", temporary, errno);
  auto write_all = [&](const void* data, std::uint64_t bytes) {
    const auto* at = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t written = ::write(descriptor, at, bytes);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) {
        const int error = written < 0 ? errno : ENOSPC;
        ::close(descriptor);
        ::unlink(temporary.c_str());
        fail_io("write", temporary, error);
      }
      at += written;
      bytes -= static_cast<std::uint64_t>(written);
    }
  };
  const char zeros[8] = {};
  write_all(&header, sizeof header);
  for (const auto& [data, bytes] : parts) {
    write_all(data, bytes);
    write_all(zeros, padded(bytes) - bytes);
  }
  if (::fsync(descriptor) != 0 || ::close(descriptor) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail_io("sync", temporary, error);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail_io("rename onto", path, error);
  }
}

}  // namespace

std::shared_ptr<const MegatronGptIndex> MegatronGptIndex::open(const IndexedDataset& dataset,
                                                               SequenceRange range,
                                                               MegatronOrderConfig config,
                                                               const std::string& cache_directory) {
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t lengths_hash = 0;
  // The sizes first (cheap); the arrays are built or mapped below.
  std::shared_ptr<MegatronGptIndex> index(new MegatronGptIndex(dataset, range, config, &lengths_hash));
  const std::string idx_path = dataset.prefix() + ".idx";
  std::error_code error;
  const auto idx_bytes = std::filesystem::file_size(idx_path, error);
  const std::string description =
      nlohmann::json{{"format", "tandem GPTDataset indices (megatron-core 0.16.1 rules)"},
                     {"prefix", std::filesystem::absolute(dataset.prefix()).lexically_normal().string()},
                     {"idx_bytes", error ? 0 : idx_bytes},
                     {"sequences", dataset.sequence_count()},
                     {"range", {range.begin, range.end}},
                     {"lengths_hash", hex64(lengths_hash)},
                     {"seq_length", config.seq_length},
                     {"num_samples", config.num_samples},
                     {"seed", config.seed}}
          .dump();
  std::uint64_t name_hash = kFnvOffset;
  for (const char c : description) name_hash = (name_hash ^ static_cast<unsigned char>(c)) * kFnvPrime;
  std::filesystem::create_directories(cache_directory, error);
  if (error) fail_io("create the directory", cache_directory, error.value());
  const std::string path =
      (std::filesystem::path(cache_directory) / ("tandem-gpt-index-" + hex64(name_hash) + ".bin")).string();

  const std::uint64_t entries = static_cast<std::uint64_t>(index->epochs_ * range.size());
  const std::uint64_t samples = static_cast<std::uint64_t>(index->sample_count_);
  const std::uint64_t width = index->narrow_shuffle() ? sizeof(std::uint32_t) : sizeof(std::int64_t);
  const Layout layout = layout_of(description.size(), entries, samples, width);

  // Maps `path` and checks it against everything computed above; "" when `index` now views it,
  // otherwise why the file cannot be used.
  auto load = [&]() -> std::string {
    const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) return errno == ENOENT ? "absent" : std::string("unreadable: ") + std::strerror(errno);
    struct stat status {};
    if (::fstat(descriptor, &status) != 0 || status.st_size < static_cast<off_t>(sizeof(CacheHeader))) {
      ::close(descriptor);
      return "truncated: shorter than its header";
    }
    auto mapping = std::make_shared<Mapping>();
    mapping->bytes = static_cast<std::size_t>(status.st_size);
    mapping->base = ::mmap(nullptr, mapping->bytes, PROT_READ, MAP_SHARED, descriptor, 0);
    ::close(descriptor);  // the mapping stays valid
    if (mapping->base == MAP_FAILED) {
      mapping->base = nullptr;
      return std::string("cannot be mapped: ") + std::strerror(errno);
    }
    const auto* bytes = static_cast<const unsigned char*>(mapping->base);
    CacheHeader header{};
    std::memcpy(&header, bytes, sizeof header);
    if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0 || header.version != kFormatVersion) {
      return "not a tandem index file of format version " + std::to_string(kFormatVersion);
    }
    if (header.file_bytes != mapping->bytes) {
      return "truncated or extended: " + std::to_string(mapping->bytes) + " bytes, its header says " +
             std::to_string(header.file_bytes);
    }
    if (header.description_bytes != description.size() || mapping->bytes < layout.document_index ||
        std::memcmp(bytes + layout.description, description.data(), description.size()) != 0) {
      return "built for another dataset or configuration";
    }
    if (header.tokens_per_epoch != index->tokens_per_epoch_ || header.epochs != index->epochs_ ||
        header.separate_final_epoch != (index->separate_final_epoch_ ? 1 : 0) ||
        header.sample_count != index->sample_count_ || header.entries != entries ||
        header.shuffle_width != width || header.file_bytes != layout.end) {
      return "its sizes differ from the ones this configuration gives";
    }
    std::uint64_t checksum = kFnvOffset;
    mix(checksum, bytes + sizeof(CacheHeader), layout.end - sizeof(CacheHeader));
    if (checksum != header.checksum) return "corrupt: its checksum does not match its contents";
    index->document_index_ = {reinterpret_cast<const std::int32_t*>(bytes + layout.document_index), entries};
    index->document_starts_ = {reinterpret_cast<const std::int64_t*>(bytes + layout.document_starts),
                               entries + 1};
    if (width == sizeof(std::uint32_t)) {
      index->shuffle32_ = {reinterpret_cast<const std::uint32_t*>(bytes + layout.shuffle), samples};
    } else {
      index->shuffle64_ = {reinterpret_cast<const std::int64_t*>(bytes + layout.shuffle), samples};
    }
    index->storage_ = std::move(mapping);
    index->origin_ = IndexOrigin::loaded;
    return "";
  };

  std::string rejected = load();
  if (!rejected.empty()) {
    // One builder at a time; whoever waited here finds the file the first one wrote.
    const FileLock lock(path + ".lock");
    rejected = load();
    if (!rejected.empty()) {
      if (rejected != "absent") {
        std::cerr << "data: --data-cache-path file " + path + " is " + rejected + "; rebuilding it\n";
      }
      index->build_arrays(dataset, range);
      CacheHeader header{};
      std::memcpy(header.magic, kMagic, sizeof kMagic);
      header.version = kFormatVersion;
      header.description_bytes = description.size();
      header.tokens_per_epoch = index->tokens_per_epoch_;
      header.epochs = index->epochs_;
      header.separate_final_epoch = index->separate_final_epoch_ ? 1 : 0;
      header.sample_count = index->sample_count_;
      header.entries = entries;
      header.shuffle_width = width;
      header.file_bytes = layout.end;
      const std::vector<std::pair<const void*, std::uint64_t>> parts = {
          {description.data(), description.size()},
          {index->document_index_.data(), entries * sizeof(std::int32_t)},
          {index->document_starts_.data(), (entries + 1) * sizeof(std::int64_t)},
          {width == sizeof(std::uint32_t) ? static_cast<const void*>(index->shuffle32_.data())
                                          : static_cast<const void*>(index->shuffle64_.data()),
           samples * width}};
      header.checksum = kFnvOffset;
      for (const auto& [data, bytes] : parts) mix(header.checksum, data, bytes);
      write_atomically(path, header, parts);
      index->origin_ = IndexOrigin::built_and_cached;
    }
  }
  index->cache_file_ = path;
  std::cerr << "data: Megatron's indices of " + dataset.prefix() + " sequences [" +
                   std::to_string(range.begin) + ", " + std::to_string(range.end) + ") (" +
                   std::to_string(index->sample_count_) + " samples of " +
                   std::to_string(config.seq_length) + " tokens): " +
                   (index->origin_ == IndexOrigin::loaded ? "loaded from " : "built and cached in ") +
                   path + " in " + seconds_text(start) + "\n";
  return index;
}

}  // namespace tandem::data
