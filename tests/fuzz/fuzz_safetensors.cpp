// libFuzzer target: the safetensors reader (core/checkpoint/safetensors.hpp) on arbitrary bytes.
// A refused file is a std::runtime_error naming it (the reader's clean error); a crash, a
// sanitizer report, a hang, a leak or any other exception is a finding. A file the reader accepts
// must encode back to a file that decodes to the same tensors.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <vector>

#include "core/checkpoint/safetensors.hpp"
#include "tests/fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tandem::fuzz::silence_standard_streams();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::checkpoint;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  SafetensorsContents contents;
  try {
    contents = decode_safetensors(bytes, "fuzz input");
  } catch (const std::runtime_error&) {
    return 0;
  }
  // Accepted: what the writer makes of it must read back as the same tensors and metadata.
  const std::vector<std::byte> again = encode_safetensors(contents.tensors, contents.metadata);
  const SafetensorsContents reread = decode_safetensors(again, "re-encoded fuzz input");
  // The writer may lay the tensors out in another order (largest dtype first, then by name).
  const auto by_name = [](std::vector<TensorData> tensors) {
    std::sort(tensors.begin(), tensors.end(), [](const TensorData& a, const TensorData& b) { return a.name < b.name; });
    return tensors;
  };
  if (reread.metadata != contents.metadata || by_name(reread.tensors) != by_name(contents.tensors)) {
    std::fprintf(stderr, "tandem fuzz: an accepted safetensors file does not survive encode + decode\n");
    std::abort();
  }
  return 0;
}
