// libFuzzer target: the JSON config (`--config FILE.json`, core/args.hpp) on arbitrary file
// contents, through what `tandem plan --config FILE.json` does with it (run_config_entry.hpp).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "tests/fuzz/fuzz_support.hpp"
#include "tests/fuzz/run_config_entry.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tandem::fuzz::silence_standard_streams();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = (tandem::fuzz::scratch_directory() / "run.json").string();
  tandem::fuzz::write_file(path, std::span(data, size));
  tandem::fuzz::plan_from_words({"--config", path});
  return 0;
}
