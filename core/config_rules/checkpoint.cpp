// The checkpoint options' rules (SPEC 9).
#include "core/config_rules/rules.hpp"

#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <utility>

namespace tandem::config_rules {

// --save and --load name directories: an existing file there is refused before anything runs
// (--save FILE gave a raw file-system error; --load FILE would start from the initialization).
void check_checkpoint_directories(const RunConfig& config, Checker& checker) {
  for (const auto& [path, field] : std::initializer_list<std::pair<const std::string*, const char*>>{
           {&config.checkpoint.save, "--save"}, {&config.checkpoint.load, "--load"}}) {
    std::error_code ignored;
    checker.check(path->empty() || !std::filesystem::exists(*path, ignored) || std::filesystem::is_directory(*path, ignored),
                  field, *path, "is a file: it must name a directory", "give a directory (it is created when missing)");
  }
}

// Updates between checkpoints; 0 saves only at the end.
void check_save_interval(const RunConfig& config, Checker& checker) {
  checker.check(config.checkpoint.save_interval >= 0, "--save-interval",
                text(config.checkpoint.save_interval), "must be >= 0",
                "use 0 to save only at the end");
}

}  // namespace tandem::config_rules
