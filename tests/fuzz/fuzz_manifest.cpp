// libFuzzer target: a checkpoint's manifest.json (core/checkpoint/manifest.hpp, docs/checkpoint.md)
// read by the real load path, load_checkpoint, from a directory holding only that manifest.
// Each input is tried twice: as it is (the JSON parser and the manifest's checksum), and, when it
// is a JSON object, resealed with its correct manifest_crc32, so the mutations reach the field
// checks behind the checksum (whole-file and sharded formats, the layout and shard ranges). A
// refused manifest is a std::runtime_error naming the file (the loader's clean error; the tensor
// files are absent, so every manifest that passes the field checks is refused there); a crash, a
// sanitizer report, a hang, a leak or any other exception is a finding.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/manifest.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

// Loads the checkpoint in `directory` (its manifest and nothing else); a clean refusal is fine.
void try_load(const std::filesystem::path& directory) {
  try {
    tandem::checkpoint::load_checkpoint(directory);
  } catch (const std::runtime_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tandem::fuzz::silence_standard_streams();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace checkpoint = tandem::checkpoint;
  // Not named iter_NNNNNNN: the directory-name check would refuse most edited iterations first.
  const std::filesystem::path directory = tandem::fuzz::scratch_directory() / "checkpoint";
  std::filesystem::create_directories(directory);
  const std::filesystem::path manifest_path = directory / checkpoint::kManifestFileName;
  tandem::fuzz::write_file(manifest_path, std::span(data, size));
  try_load(directory);

  nlohmann::json manifest = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object()) return 0;
  checkpoint::manifest::seal(manifest);
  const std::string resealed = manifest.dump(2);
  tandem::fuzz::write_file(manifest_path, std::span(reinterpret_cast<const std::uint8_t*>(resealed.data()),
                                                    resealed.size()));
  try_load(directory);
  return 0;
}
