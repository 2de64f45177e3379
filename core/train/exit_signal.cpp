// The SIGTERM flag (exit_signal.hpp). The handler only stores to a lock-free atomic, which is
// async-signal-safe.
#include "core/train/exit_signal.hpp"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tandem {
namespace {

std::atomic<bool> received{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_exit_signal(int) { received.store(true, std::memory_order_relaxed); }

}  // namespace

void install_exit_signal_handler() {
  struct sigaction action {};
  action.sa_handler = on_exit_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write in progress goes on; the loop checks later
  if (sigaction(SIGTERM, &action, nullptr) != 0) {
    throw std::runtime_error(std::string("--exit-signal-handler: sigaction(SIGTERM) failed: ") + std::strerror(errno));
  }
}

bool exit_signal_received() { return received.load(std::memory_order_relaxed); }

void clear_exit_signal() { received.store(false, std::memory_order_relaxed); }

}  // namespace tandem
