// Atomic, durable writes of files and directories (core/checkpoint/atomic_file.hpp, SPEC 9).
#include "core/checkpoint/atomic_file.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kWriteBufferBytes = std::size_t{1} << 20;
constexpr std::string_view kStagingMarker = ".tmp-";

[[noreturn]] void throw_os_error(const std::string& what, const fs::path& path, int error_number) {
  throw std::runtime_error(what + " " + path.string() + ": " + std::strerror(error_number));
}

void fsync_fd(int fd, const fs::path& path) {
  if (::fsync(fd) != 0) throw_os_error("cannot fsync", path, errno);
}

// The process's umask, read without changing it (umask(2) sets it too, racing other threads).
mode_t process_umask() {
  std::ifstream status("/proc/self/status");
  for (std::string key; status >> key;) {
    if (key == "Umask:") {
      std::string octal;
      status >> octal;
      return static_cast<mode_t>(std::stoul(octal, nullptr, 8));
    }
    std::string rest;
    std::getline(status, rest);
  }
  return 022;
}

// mkstemp and mkdtemp create 0600 files and 0700 directories whatever the umask: give staged
// checkpoints the modes any file the user creates gets, so a team can read them on a shared file
// system.
void apply_umask(const char* path, bool directory) {
  const mode_t mode = (directory ? 0777 : 0666) & ~process_umask();
  if (::chmod(path, mode) != 0) throw_os_error("cannot set the mode of", fs::path(path), errno);
}

// mkstemp/mkdtemp want a mutable template ending in XXXXXX.
std::vector<char> staging_template(const fs::path& final_path) {
  const std::string text = final_path.string() + std::string(kStagingMarker) + "XXXXXX";
  return std::vector<char>(text.begin(), text.end() + 1);
}

void fsync_tree(const fs::path& directory) {
  for (const auto& entry : fs::recursive_directory_iterator(directory)) {
    if (!entry.is_regular_file() && !entry.is_directory()) continue;
    const int flags = entry.is_directory() ? (O_RDONLY | O_DIRECTORY) : O_RDONLY;
    const int fd = ::open(entry.path().c_str(), flags | O_CLOEXEC);
    if (fd < 0) throw_os_error("cannot open for fsync", entry.path(), errno);
    const int result = ::fsync(fd);
    const int error_number = errno;
    ::close(fd);
    if (result != 0) throw_os_error("cannot fsync", entry.path(), error_number);
  }
  fsync_directory(directory);
}

}  // namespace

std::string crc32_hex(std::uint32_t crc32) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", static_cast<unsigned>(crc32));
  return text;
}

FileDigest digest_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open", path, errno);
  boost::crc_32_type crc;
  std::vector<char> chunk(kWriteBufferBytes);
  FileDigest digest;
  for (;;) {
    const ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      ::close(fd);
      throw_os_error("cannot read", path, error_number);
    }
    if (got == 0) break;
    crc.process_bytes(chunk.data(), static_cast<std::size_t>(got));
    digest.size_bytes += static_cast<std::uint64_t>(got);
  }
  ::close(fd);
  digest.crc32 = crc.checksum();
  return digest;
}

FileWriter::FileWriter(fs::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);  // less the umask
  if (fd_ < 0) throw_os_error("cannot create", path_, errno);
  buffer_.reserve(kWriteBufferBytes);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, std::size_t size_bytes) {
  if (fd_ < 0) throw std::logic_error("write to closed file " + path_.string());
  crc_.process_bytes(data, size_bytes);
  size_bytes_ += size_bytes;
  const char* bytes = static_cast<const char*>(data);
  if (buffer_.size() + size_bytes <= kWriteBufferBytes) {
    buffer_.append(bytes, size_bytes);
    return;
  }
  flush_buffer();
  if (size_bytes < kWriteBufferBytes) {
    buffer_.append(bytes, size_bytes);
    return;
  }
  // A large block goes straight to the file.
  while (size_bytes > 0) {
    const ssize_t wrote = ::write(fd_, bytes, size_bytes);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw_os_error("cannot write", path_, errno);
    }
    bytes += wrote;
    size_bytes -= static_cast<std::size_t>(wrote);
  }
}

void FileWriter::flush_buffer() {
  const char* bytes = buffer_.data();
  std::size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t wrote = ::write(fd_, bytes, left);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw_os_error("cannot write", path_, errno);
    }
    bytes += wrote;
    left -= static_cast<std::size_t>(wrote);
  }
  buffer_.clear();
}

FileDigest FileWriter::close() {
  flush_buffer();
  fsync_fd(fd_, path_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_os_error("cannot close", path_, errno);
  return FileDigest{size_bytes_, crc_.checksum()};
}

void fsync_directory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open directory", directory, errno);
  const int result = ::fsync(fd);
  const int error_number = errno;
  ::close(fd);
  if (result != 0) throw_os_error("cannot fsync directory", directory, error_number);
}

FileDigest write_file_atomically(const fs::path& path, std::string_view contents) {
  auto name = staging_template(path);
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw_os_error("cannot create a temporary file beside", path, errno);
  ::close(fd);
  const fs::path staging{name.data()};
  apply_umask(name.data(), false);
  try {
    FileWriter writer(staging);
    writer.write(contents);
    const FileDigest digest = writer.close();
    if (::rename(staging.c_str(), path.c_str()) != 0) throw_os_error("cannot rename onto", path, errno);
    fsync_directory(path.has_parent_path() ? path.parent_path() : fs::path("."));
    return digest;
  } catch (...) {
    std::error_code ignored;
    fs::remove(staging, ignored);
    throw;
  }
}

StagedDirectory::StagedDirectory(fs::path final_path) : final_path_(std::move(final_path)) {
  if (final_path_.filename().empty()) final_path_ = final_path_.parent_path();
  auto name = staging_template(final_path_);
  if (::mkdtemp(name.data()) == nullptr) {
    throw_os_error("cannot create a staging directory beside", final_path_, errno);
  }
  staging_path_ = fs::path(name.data());
  lock_fd_ = ::open(staging_path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error_number = errno;
    if (lock_fd_ >= 0) ::close(lock_fd_);
    std::error_code ignored;
    fs::remove_all(staging_path_, ignored);
    throw_os_error("cannot lock the staging directory", staging_path_, error_number);
  }
  apply_umask(name.data(), true);
}

StagedDirectory::~StagedDirectory() {
  if (!committed_) {
    std::error_code ignored;
    fs::remove_all(staging_path_, ignored);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::vector<fs::path> remove_abandoned_staging(const fs::path& final_path) {
  fs::path target = final_path;
  if (target.filename().empty()) target = target.parent_path();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + std::string(kStagingMarker);
  std::vector<fs::path> removed;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !is_staging_name(name)) continue;
    if (!entry.is_directory(error) || entry.is_symlink(error)) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    // A writer holds its lock until it commits or ends; one we can take is nobody's.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code ignored;
      if (fs::remove_all(entry.path(), ignored) > 0 && !ignored) removed.push_back(entry.path());
    }
    ::close(fd);
  }
  return removed;
}

void StagedDirectory::commit() {
  if (committed_) throw std::logic_error("staged directory committed twice: " + final_path_.string());
  fsync_tree(staging_path_);
  std::error_code status_error;
  const bool final_exists = fs::exists(fs::symlink_status(final_path_, status_error));
  if (!final_exists) {
    if (::rename(staging_path_.c_str(), final_path_.c_str()) != 0) {
      throw_os_error("cannot rename " + staging_path_.string() + " onto", final_path_, errno);
    }
  } else {
    // Swap atomically: the final name holds the old or the new directory at every instant.
    if (::renameat2(AT_FDCWD, staging_path_.c_str(), AT_FDCWD, final_path_.c_str(),
                    RENAME_EXCHANGE) != 0) {
      throw_os_error("cannot exchange " + staging_path_.string() + " with", final_path_, errno);
    }
  }
  committed_ = true;
  const fs::path parent = final_path_.has_parent_path() ? final_path_.parent_path() : fs::path(".");
  fsync_directory(parent);
  if (final_exists) {
    // The staging name now holds the previous directory.
    fs::remove_all(staging_path_);
    fsync_directory(parent);
  }
}

bool is_staging_name(std::string_view name) {
  const auto marker = name.rfind(kStagingMarker);
  return marker != std::string_view::npos && name.size() == marker + kStagingMarker.size() + 6;
}

}  // namespace tandem::checkpoint
