// One run at a time in a --save directory: an advisory lock (flock on SAVE/.tandem-lock) held for
// the life of the run. The operating system drops it when the process ends, however it ends
// (kill -9 included), so a crashed run never leaves the directory locked. Two runs started into
// one --save mixed their checkpoints and tore each other's log; the second now refuses at start,
// naming the holder.
#pragma once

#include <filesystem>
#include <string>

namespace tandem::checkpoint {

inline constexpr const char* kSaveLockFileName = ".tandem-lock";

class SaveLock {
 public:
  // Creates `save` if needed and locks it. Throws ConfigError (exit 2) naming --save, the holder
  // (its pid, host and start time, as it wrote them) and the fix when another process holds it;
  // std::runtime_error naming the path when the lock file cannot be opened.
  explicit SaveLock(const std::filesystem::path& save);
  ~SaveLock();
  SaveLock(const SaveLock&) = delete;
  SaveLock& operator=(const SaveLock&) = delete;

 private:
  int descriptor_ = -1;
};

}  // namespace tandem::checkpoint
