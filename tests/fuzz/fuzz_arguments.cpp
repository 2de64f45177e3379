// libFuzzer target: the argument parser (core/args.hpp) on arbitrary command lines, through what
// `tandem plan` does with them (run_config_entry.hpp). The input is the words after
// `tandem plan`, one per line (the seed corpus holds Megatron fragments, tests/fuzz/make_seed_corpus.sh).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_support.hpp"
#include "tests/fuzz/run_config_entry.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tandem::fuzz::silence_standard_streams();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words(1);
  for (std::size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n') {
      words.emplace_back();
    } else if (c != '\0') {  // argv words are C strings
      words.back().push_back(c);
    }
  }
  if (words.back().empty()) words.pop_back();
  tandem::fuzz::plan_from_words(words);
  return 0;
}
