// Failures on launched ranks (ranks.hpp).
#include "cli/ranks.hpp"

#include <unistd.h>

#include <exception>
#include <string>
#include <iostream>

#include "core/args.hpp"

namespace tandem::cli {

int run_as_ranks(const production::MpiSession& session, const std::function<int()>& body) {
  if (session.world_size() == 1) return body();
  try {
    return body();
  } catch (const ConfigError& error) {
    if (session.rank() == 0) std::cerr << error.what();
    return 2;
  } catch (const std::exception& error) {
    // One write() of the whole line: ranks failing at once interleaved their messages mid-line.
    const std::string line = "error: rank " + std::to_string(session.rank()) + " of " +
                             std::to_string(session.world_size()) + ": " + error.what() + "\n";
    std::cerr.flush();
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
    session.abort(1);
  }
}

}  // namespace tandem::cli
