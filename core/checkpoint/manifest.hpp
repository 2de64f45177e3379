// The manifest of a checkpoint directory (checkpoint.hpp, sharded.hpp): writing it, reading and
// checking every field, and verifying the tensor files it lists. Shared by the whole-file format
// (format_version 1) and the sharded ones (format_version 2 and 3); not an interface for trainers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/safetensors.hpp"

namespace tandem::checkpoint::manifest {

// Throws std::runtime_error "checkpoint file FILE: PROBLEM".
[[noreturn]] void fail(const std::filesystem::path& file, const std::string& problem);

// Throws std::invalid_argument when `precision` is not a main precision, or a tensor is not in it.
void check_precision(const std::string& precision, const std::string& where);
void check_tensors_precision(const std::vector<TensorData>& tensors, const std::string& precision,
                             const std::string& where);

// The metadata every checkpoint tensor file carries (format, producer, engine, iteration).
SafetensorsMetadata file_metadata(const CheckpointState& state);

// Creates `save_dir` and removes what interrupted saves left in it (staging directories and
// temporary trackers).
void prepare_save_directory(const std::filesystem::path& save_dir);

// The manifest's record of one written file.
nlohmann::json file_record(const FileDigest& digest, std::size_t tensor_count);

// The manifest of `state` (its tensors are not looked at) with `files` and `format_version`;
// `sections` are added as they are (the sharded format's layout and shards).
nlohmann::json make_manifest(const CheckpointState& state, std::int64_t format_version,
                             const nlohmann::json& files, const nlohmann::json& sections = nlohmann::json::object());

// The manifest's own checksum (docs/checkpoint.md "The manifest"): field `manifest_crc32`, the
// CRC-32 (8 hex digits) of the manifest's compact JSON with keys sorted and that field left out,
// so an edit of any field (a consumed_samples moved from 40 to 50) is refused on load.
inline constexpr std::string_view kManifestChecksumField = "manifest_crc32";
std::string manifest_checksum(const nlohmann::json& manifest);
// Sets `manifest_crc32` to the checksum of the rest (make_manifest does; tests that edit a
// manifest on purpose reseal it to reach the check they aim at).
void seal(nlohmann::json& manifest);

// Writes the manifest into a staging directory (fsynced).
void write_manifest(const std::filesystem::path& directory, const nlohmann::json& manifest);

struct ReadManifest {
  nlohmann::json json;
  std::filesystem::path path;
  std::int64_t format_version = 0;
  CheckpointState state;  // every field but the tensors
};

// Reads DIRECTORY/manifest.json and checks its checksum, the format, the version (1, 2 or 3), every
// field the state needs (presence, type, range, agreement between fields), and that the
// iteration agrees with the directory's name. Throws naming the file, the field, the value and the
// rule. A manifest written before manifests had a checksum loads with a warning on stderr.
ReadManifest read_manifest(const std::filesystem::path& directory);

// Field access with errors naming the manifest and the field.
const nlohmann::json& field(const nlohmann::json& object, std::string_view name, const std::filesystem::path& manifest);
std::int64_t integer_field(const nlohmann::json& object, std::string_view name, const std::filesystem::path& manifest);
std::string string_field(const nlohmann::json& object, std::string_view name, const std::filesystem::path& manifest);
const nlohmann::json& object_field(const nlohmann::json& object, std::string_view name, const std::filesystem::path& manifest);

// Checks that DIRECTORY/NAME exists and that its size and CRC-32 match the manifest's `files`.
void verify_file(const std::filesystem::path& directory, const nlohmann::json& files, std::string_view name,
                 const std::filesystem::path& manifest);

// Reads a verified tensor file; every tensor must be in `precision`.
std::vector<TensorData> read_tensor_file(const std::filesystem::path& path, const std::string& precision);

}  // namespace tandem::checkpoint::manifest
