// Failures on launched ranks (ranks.hpp).
#include "cli/ranks.hpp"

#include <exception>
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
    std::cerr << "error: rank " << session.rank() << " of " << session.world_size() << ": "
              << error.what() << "\n";
    std::cerr.flush();
    session.abort(1);
  }
}

}  // namespace tandem::cli
