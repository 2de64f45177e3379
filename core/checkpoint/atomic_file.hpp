// Atomic, durable writes of single files and whole directories (SPEC 9: a new checkpoint appears
// complete or not at all; an interrupted write never damages the previous one).
//
// A file is written under a temporary name in its own directory, fsynced, renamed over the final
// name and the directory fsynced. A directory is built under `FINAL.tmp-XXXXXX` beside its final
// place, every file in it fsynced, then renamed into place (an existing one is swapped out
// atomically and removed). Every error names the path and the operating system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <boost/crc.hpp>

namespace tandem::checkpoint {

// What a written file holds, for the checkpoint manifest: its size and CRC-32 (the zlib/PNG
// polynomial, boost::crc_32_type; the value `crc32` or Python's zlib.crc32 prints).
struct FileDigest {
  std::uint64_t size_bytes = 0;
  std::uint32_t crc32 = 0;
};

// "1c291ca3": the lowercase, zero-padded hex form used in manifests.
std::string crc32_hex(std::uint32_t crc32);

// Reads a whole file once and returns its size and CRC-32. Throws naming the path.
FileDigest digest_file(const std::filesystem::path& path);

// A plain POSIX file opened for writing (created or truncated), with a buffer, a running size and
// CRC-32 of what was written. close() flushes, fsyncs and closes; the destructor of an unclosed
// writer closes without syncing and leaves the file as it is (its directory is a staging one).
class FileWriter {
 public:
  explicit FileWriter(std::filesystem::path path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, std::size_t size_bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  FileDigest close();  // flush, fsync, close; returns what was written

  const std::filesystem::path& path() const { return path_; }

 private:
  void flush_buffer();

  std::filesystem::path path_;
  int fd_ = -1;
  std::string buffer_;
  std::uint64_t size_bytes_ = 0;
  boost::crc_32_type crc_;
};

// fsync a directory so that the names created, removed or renamed in it are durable.
void fsync_directory(const std::filesystem::path& directory);

// Replaces `path` atomically with `contents`: a temporary file beside it, fsync, rename, fsync of
// the directory. Readers see the old contents or the new, never a mixture.
FileDigest write_file_atomically(const std::filesystem::path& path, std::string_view contents);

// A directory built beside its final place and moved there in one rename by commit().
// Until then nothing is visible under the final name; if commit() is never reached (an exception),
// the destructor removes the staging directory and the final name keeps what it had. While it
// lives it holds an flock on the staging directory, which the operating system drops however the
// process ends: a staging directory nobody holds was left by a killed process
// (remove_abandoned_staging).
class StagedDirectory {
 public:
  // Creates `FINAL.tmp-XXXXXX` (the parent must exist).
  explicit StagedDirectory(std::filesystem::path final_path);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::filesystem::path& staging_path() const { return staging_path_; }
  const std::filesystem::path& final_path() const { return final_path_; }

  // fsync every file in the staging directory and the directory itself, rename it to the final
  // path (atomically exchanging it with an existing directory there, which is then removed), and
  // fsync the parent.
  void commit();

 private:
  std::filesystem::path final_path_;
  std::filesystem::path staging_path_;
  int lock_fd_ = -1;  // holds the flock on the staging directory
  bool committed_ = false;
};

// Removes the staging directories of `final_path` (FINAL.tmp-XXXXXX) that no process holds: what
// a killed export left. Returns what it removed. A live writer's directory is never touched.
std::vector<std::filesystem::path> remove_abandoned_staging(const std::filesystem::path& final_path);

// True when `name` is a staging name that StagedDirectory or write_file_atomically makes
// ("iter_0000042.tmp-AbC123"): what an interrupted write leaves behind.
bool is_staging_name(std::string_view name);

}  // namespace tandem::checkpoint
