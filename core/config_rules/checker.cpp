// What every component's rules share: the Checker's table rules and how an issue prints a value.
#include "core/config_rules/rules.hpp"

#include <cmath>
#include <sstream>

namespace tandem::config_rules {

std::string text(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}
std::string text(std::int64_t value) { return std::to_string(value); }

void Checker::check_at_least_one(const Counts& counts) {
  for (const auto& [value, field] : counts) {
    check(value >= 1, field, text(value), "must be at least 1", "give a positive count");
  }
}

void Checker::check_dimensions(const Counts& sizes) {
  for (const auto& [value, field] : sizes) {
    check(value <= kMaxDimension, field, std::to_string(value),
          "must be at most 2,147,483,647 (2^31 - 1: tandem's kernels index with it)", "give a realistic size");
  }
}

// `--lr inf` or `--lr 1e400` (which parses as infinity) would train to NaN and exit 0.
void Checker::check_finite(const Reals& reals) {
  for (const auto& [value, field] : reals) {
    check(std::isfinite(value), field, text(value), "must be a finite number",
          "give a finite value (1e400 overflows to infinity)");
  }
}

std::string default_note(const RunArguments& args, const char* option) {
  return args.given(option) ? std::string() : std::string(" (the default: not given)");
}

}  // namespace tandem::config_rules
