// The stop-signal flag (exit_signal.hpp). The handler only stores to a lock-free atomic, which is
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

// The first signal received, 0 for none.
std::atomic<int> received{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_exit_signal(int number) {
  int none = 0;
  received.compare_exchange_strong(none, number, std::memory_order_relaxed);
}

struct HandledSignal {
  int number;
  const char* name;
};
constexpr HandledSignal kHandled[] = {{SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"}, {SIGUSR1, "SIGUSR1"}};

}  // namespace

void install_exit_signal_handler() {
  struct sigaction action {};
  action.sa_handler = on_exit_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write in progress goes on; the loop checks later
  for (const auto& handled : kHandled) {
    if (sigaction(handled.number, &action, nullptr) != 0) {
      throw std::runtime_error(std::string("--exit-signal-handler: sigaction(") + handled.name +
                               ") failed: " + std::strerror(errno));
    }
  }
}

bool exit_signal_received() { return received.load(std::memory_order_relaxed) != 0; }

std::string exit_signal_name() {
  const int number = received.load(std::memory_order_relaxed);
  for (const auto& handled : kHandled) {
    if (handled.number == number) return handled.name;
  }
  return "";
}

void clear_exit_signal() { received.store(0, std::memory_order_relaxed); }

}  // namespace tandem
