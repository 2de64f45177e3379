// Checkpoint manifests: writing, reading, checking, verifying listed files (manifest.hpp).
#include "core/checkpoint/manifest.hpp"

#include <fstream>
#include <stdexcept>
#include <system_error>

namespace tandem::checkpoint::manifest {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::string_view kIterationPrefix = "iter_";

}  // namespace

void fail(const fs::path& file, const std::string& problem) {
  throw std::runtime_error("checkpoint file " + file.string() + ": " + problem);
}

void check_precision(const std::string& precision, const std::string& where) {
  if (precision != kDtypeF32 && precision != kDtypeF64) {
    throw std::invalid_argument(where + ": precision \"" + precision +
                                "\" is not a main precision; use F64 (reference) or F32 "
                                "(production), SPEC 9");
  }
}

void check_tensors_precision(const std::vector<TensorData>& tensors, const std::string& precision,
                             const std::string& where) {
  for (const auto& tensor : tensors) {
    if (tensor.dtype != precision) {
      throw std::invalid_argument(where + ": tensor " + tensor.name + " is " + tensor.dtype +
                                  " but the checkpoint's precision is " + precision +
                                  "; store main state in the engine's main precision (SPEC 9)");
    }
  }
}

SafetensorsMetadata file_metadata(const CheckpointState& state) {
  return {{"format", "pt"},
          {"producer", std::string(kCheckpointFormat)},
          {"engine", state.engine},
          {"iteration", std::to_string(state.counters.iteration)}};
}

void prepare_save_directory(const fs::path& save_dir) {
  fs::create_directories(save_dir);
  for (const auto& entry : fs::directory_iterator(save_dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.starts_with(kIterationPrefix) || name.starts_with(kTrackerFileName);
    if (ours && is_staging_name(name)) fs::remove_all(entry.path());
  }
}

json file_record(const FileDigest& digest, std::size_t tensor_count) {
  return {{"size_bytes", digest.size_bytes}, {"crc32", crc32_hex(digest.crc32)}, {"tensors", tensor_count}};
}

json make_manifest(const CheckpointState& state, std::int64_t format_version, const json& files,
                   const json& sections) {
  const json& settings = state.run_config;
  json manifest{
      {"format", kCheckpointFormat},
      {"format_version", format_version},
      {"engine", state.engine},
      {"precision", state.precision},
      {"iteration", state.counters.iteration},
      {"counters", state.counters},
      {"optimizer",
       {{"step", state.counters.successful_updates},
        {"settings", settings.is_object() ? settings.value("optimizer", json::object()) : json::object()}}},
      {"scheduler",
       {{"num_samples", state.counters.scheduler_samples},
        {"settings", settings.is_object() ? settings.value("schedule", json::object()) : json::object()}}},
      {"data_position", state.data_position},
      {"random_streams", state.random_streams},
      {"parallel_layout", state.parallel_layout},
      {"run_config", state.run_config},
      {"extra", state.extra},
      {"files", files},
  };
  for (const auto& [name, value] : sections.items()) manifest[name] = value;
  return manifest;
}

void write_manifest(const fs::path& directory, const json& manifest) {
  FileWriter writer(directory / kManifestFileName);
  writer.write(manifest.dump(2) + "\n");
  writer.close();
}

const json& field(const json& object, std::string_view name, const fs::path& manifest) {
  const auto found = object.find(name);
  if (found == object.end()) fail(manifest, "field \"" + std::string(name) + "\" is missing");
  return *found;
}

std::int64_t integer_field(const json& object, std::string_view name, const fs::path& manifest) {
  const json& value = field(object, name, manifest);
  if (!value.is_number_integer()) {
    fail(manifest, "field \"" + std::string(name) + "\" holds " + value.dump() + ", not an integer");
  }
  return value.get<std::int64_t>();
}

std::string string_field(const json& object, std::string_view name, const fs::path& manifest) {
  const json& value = field(object, name, manifest);
  if (!value.is_string()) {
    fail(manifest, "field \"" + std::string(name) + "\" holds " + value.dump() + ", not a string");
  }
  return value.get<std::string>();
}

const json& object_field(const json& object, std::string_view name, const fs::path& manifest) {
  const json& value = field(object, name, manifest);
  if (!value.is_object()) {
    fail(manifest, "field \"" + std::string(name) + "\" holds " + value.dump() + ", not an object");
  }
  return value;
}

ReadManifest read_manifest(const fs::path& directory) {
  ReadManifest out;
  out.path = directory / kManifestFileName;
  const fs::path& path = out.path;
  std::ifstream in(path);
  if (!in) fail(path, "cannot be opened; the checkpoint is incomplete");
  try {
    out.json = json::parse(in);
  } catch (const json::exception& error) {
    fail(path, std::string("is not valid JSON (truncated or corrupt): ") + error.what());
  }
  const json& manifest = out.json;
  if (!manifest.is_object()) fail(path, "is not a JSON object");
  const std::string format = string_field(manifest, "format", path);
  if (format != kCheckpointFormat) {
    fail(path, "format is \"" + format + "\", not \"" + std::string(kCheckpointFormat) + "\"");
  }
  out.format_version = integer_field(manifest, "format_version", path);
  if (out.format_version != kCheckpointFormatVersion && !is_sharded_format_version(out.format_version)) {
    fail(path, "format_version is " + std::to_string(out.format_version) + "; this build reads " +
                   std::to_string(kCheckpointFormatVersion) + " (whole files), " +
                   std::to_string(kShardedCheckpointFormatVersion) + " (per-rank shards, one range each) and " +
                   std::to_string(kRangedShardedCheckpointFormatVersion) + " (per-rank shards, several ranges each)");
  }

  CheckpointState& state = out.state;
  state.engine = string_field(manifest, "engine", path);
  state.precision = string_field(manifest, "precision", path);
  if (state.precision != kDtypeF32 && state.precision != kDtypeF64) {
    fail(path, "precision \"" + state.precision + "\" is neither F32 nor F64");
  }
  const json& counters = object_field(manifest, "counters", path);
  state.counters.iteration = integer_field(counters, "iteration", path);
  state.counters.consumed_samples = integer_field(counters, "consumed_samples", path);
  state.counters.successful_updates = integer_field(counters, "successful_updates", path);
  state.counters.skipped_updates = integer_field(counters, "skipped_updates", path);
  state.counters.consecutive_skips = integer_field(counters, "consecutive_skips", path);
  state.counters.input_tokens = integer_field(counters, "input_tokens", path);
  state.counters.loss_tokens = integer_field(counters, "loss_tokens", path);
  state.counters.pad_tokens = integer_field(counters, "pad_tokens", path);
  state.counters.scheduler_samples = integer_field(counters, "scheduler_samples", path);
  // Written since validation (docs/DATA.md section 12); a checkpoint without it evaluated nothing
  // yet as far as it records, as Megatron reads a missing consumed_valid_samples as 0.
  state.counters.consumed_valid_samples =
      counters.contains("consumed_valid_samples")
          ? integer_field(counters, "consumed_valid_samples", path)
          : 0;
  if (integer_field(manifest, "iteration", path) != state.counters.iteration) {
    fail(path, "iteration and counters.iteration disagree");
  }
  const std::string directory_name = directory.filename().empty()
                                         ? directory.parent_path().filename().string()
                                         : directory.filename().string();
  if (directory_name.starts_with(kIterationPrefix) &&
      directory_name != iteration_directory_name(state.counters.iteration)) {
    fail(path, "records iteration " + std::to_string(state.counters.iteration) +
                   " but lies in directory " + directory_name);
  }
  // SPEC 7/8: the step count t and the scheduler's n, recorded in their own sections too.
  if (integer_field(object_field(manifest, "optimizer", path), "step", path) !=
      state.counters.successful_updates) {
    fail(path, "optimizer.step and counters.successful_updates disagree");
  }
  if (integer_field(object_field(manifest, "scheduler", path), "num_samples", path) !=
      state.counters.scheduler_samples) {
    fail(path, "scheduler.num_samples and counters.scheduler_samples disagree");
  }
  state.data_position = field(manifest, "data_position", path);
  state.random_streams = field(manifest, "random_streams", path);
  state.parallel_layout = field(manifest, "parallel_layout", path);
  state.run_config = field(manifest, "run_config", path);
  state.extra = field(manifest, "extra", path);
  object_field(manifest, "files", path);
  return out;
}

void verify_file(const fs::path& directory, const json& files, std::string_view name, const fs::path& manifest) {
  const json& record = object_field(files, name, manifest);
  const fs::path path = directory / name;
  std::error_code exists_error;
  if (!fs::is_regular_file(path, exists_error)) {
    fail(path, "is missing (the manifest lists it); the checkpoint is incomplete");
  }
  const auto expected_size = integer_field(record, "size_bytes", manifest);
  const auto expected_crc = string_field(record, "crc32", manifest);
  const FileDigest digest = digest_file(path);
  if (digest.size_bytes != static_cast<std::uint64_t>(expected_size)) {
    fail(path, "is " + std::to_string(digest.size_bytes) + " bytes, the manifest recorded " +
                   std::to_string(expected_size) + "; the file is truncated or was changed");
  }
  if (crc32_hex(digest.crc32) != expected_crc) {
    fail(path, "CRC-32 is " + crc32_hex(digest.crc32) + ", the manifest recorded " + expected_crc +
                   "; the file is corrupt");
  }
}

std::vector<TensorData> read_tensor_file(const fs::path& path, const std::string& precision) {
  auto contents = read_safetensors(path);
  for (const auto& tensor : contents.tensors) {
    if (tensor.dtype != precision) {
      fail(path, "tensor " + tensor.name + " is " + tensor.dtype + " but the manifest's precision is " + precision);
    }
  }
  return std::move(contents.tensors);
}

}  // namespace tandem::checkpoint::manifest
