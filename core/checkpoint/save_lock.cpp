// The --save directory's lock (save_lock.hpp).
#include "core/checkpoint/save_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "core/config_issue.hpp"

namespace tandem::checkpoint {
namespace {

std::string holder_text() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char started[32] = {};
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(started, sizeof(started), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return "process " + std::to_string(::getpid()) + " on " + host + ", started " + started;
}

}  // namespace

SaveLock::SaveLock(const std::filesystem::path& save) {
  std::filesystem::create_directories(save);
  const std::filesystem::path path = save / kSaveLockFileName;
  descriptor_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (descriptor_ < 0) {
    throw std::runtime_error("--save " + save.string() + ": cannot open its lock file " + path.string() + " (" +
                             std::strerror(errno) + ")");
  }
  if (::flock(descriptor_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[512] = {};
    const ssize_t length = ::pread(descriptor_, holder, sizeof(holder) - 1, 0);
    ::close(descriptor_);
    descriptor_ = -1;
    const std::string who = length > 0 ? std::string(holder, static_cast<std::size_t>(length)) : "another process";
    if (error != EWOULDBLOCK) {
      throw std::runtime_error("--save " + save.string() + ": cannot lock " + path.string() + " (" +
                               std::strerror(error) + ")");
    }
    throw ConfigError({ConfigIssue{"--save", save.string(),
                                   "is in use by another run (" + who + "): two runs in one --save mix their "
                                   "checkpoints and tear each other's log",
                                   "wait for that run to end, or give this run a --save directory of its own"}});
  }
  // The holder's note, for a refused run's message (the lock holds without it).
  const std::string text = holder_text();
  const bool noted = ::ftruncate(descriptor_, 0) == 0 &&
                     ::pwrite(descriptor_, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
  (void)noted;
}

SaveLock::~SaveLock() {
  if (descriptor_ >= 0) ::close(descriptor_);  // releases the lock
}

}  // namespace tandem::checkpoint
