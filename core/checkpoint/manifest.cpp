// Checkpoint manifests: writing, reading, checking, verifying listed files (manifest.hpp).
#include "core/checkpoint/manifest.hpp"

#include <array>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <system_error>

namespace tandem::checkpoint::manifest {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::string_view kIterationPrefix = "iter_";

// What to do about a manifest that breaks a rule: tandem writes it once and never edits it.
constexpr std::string_view kManifestFix =
    "fix: the manifest was damaged or edited after tandem wrote it; restore the original "
    "manifest.json, or point --load at an earlier iter_ directory";

[[noreturn]] void refuse(const fs::path& manifest, const std::string& field, const json& value,
                         const std::string& rule) {
  fail(manifest, "field \"" + field + "\" holds " + value.dump() + ", but " + rule + "; " +
                     std::string(kManifestFix));
}

void check_checksum(const json& manifest, const fs::path& path) {
  const auto stored = manifest.find(kManifestChecksumField);
  if (stored == manifest.end()) {
    std::cerr << "warning: " << path.string() << " has no \"" << kManifestChecksumField
              << "\" (written before tandem checksummed its manifests): its fields are checked, "
                 "but an edit of them cannot be detected\n";
    return;
  }
  const std::string field(kManifestChecksumField);
  if (!stored->is_string()) refuse(path, field, *stored, "it must be a string of 8 hex digits");
  const std::string computed = manifest_checksum(manifest);
  if (stored->get<std::string>() != computed) {
    refuse(path, field, *stored,
           "the manifest's content has CRC-32 \"" + computed +
               "\" (a checkpoint's manifest must be as tandem wrote it)");
  }
}

// The SPEC 1 counters as the manifest's "counters" names them.
struct CounterField {
  const char* name;
  std::int64_t Counters::*member;
};
constexpr std::array<CounterField, 9> kRequiredCounters{{
    {"iteration", &Counters::iteration},
    {"consumed_samples", &Counters::consumed_samples},
    {"successful_updates", &Counters::successful_updates},
    {"skipped_updates", &Counters::skipped_updates},
    {"consecutive_skips", &Counters::consecutive_skips},
    {"input_tokens", &Counters::input_tokens},
    {"loss_tokens", &Counters::loss_tokens},
    {"pad_tokens", &Counters::pad_tokens},
    {"scheduler_samples", &Counters::scheduler_samples},
}};

Counters read_counters(const json& manifest, const fs::path& path) {
  const json& counters = object_field(manifest, "counters", path);
  Counters out;
  auto read = [&](const char* name) {
    const std::int64_t value = integer_field(counters, name, path);
    if (value < 0) refuse(path, std::string("counters.") + name, value, "a counter is never negative");
    return value;
  };
  for (const auto& counter : kRequiredCounters) out.*counter.member = read(counter.name);
  // Written since validation (docs/DATA.md section 12); a checkpoint without it evaluated nothing
  // yet as far as it records, as Megatron reads a missing consumed_valid_samples as 0.
  out.consumed_valid_samples = counters.contains("consumed_valid_samples") ? read("consumed_valid_samples") : 0;
  // SPEC 1/8: every iteration either updates or skips; skips in a row are among all skips; the
  // scheduler advances only on updates, by the same samples the data position does.
  if (out.successful_updates + out.skipped_updates != out.iteration) {
    refuse(path, "counters.iteration", out.iteration,
           "it must equal successful_updates + skipped_updates (" + std::to_string(out.successful_updates) +
               " + " + std::to_string(out.skipped_updates) + ")");
  }
  if (out.consecutive_skips > out.skipped_updates) {
    refuse(path, "counters.consecutive_skips", out.consecutive_skips,
           "it cannot exceed skipped_updates (" + std::to_string(out.skipped_updates) + ")");
  }
  if (out.scheduler_samples > out.consumed_samples) {
    refuse(path, "counters.scheduler_samples", out.scheduler_samples,
           "it cannot exceed consumed_samples (" + std::to_string(out.consumed_samples) + ")");
  }
  return out;
}

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
  seal(manifest);
  return manifest;
}

std::string manifest_checksum(const json& manifest) {
  json content = manifest;
  content.erase(kManifestChecksumField);
  const std::string text = content.dump();  // compact; nlohmann's objects keep their keys sorted
  boost::crc_32_type crc;
  crc.process_bytes(text.data(), text.size());
  return crc32_hex(crc.checksum());
}

void seal(json& manifest) { manifest[std::string(kManifestChecksumField)] = manifest_checksum(manifest); }

void write_manifest(const fs::path& directory, const json& manifest) {
  FileWriter writer(directory / kManifestFileName);
  writer.write(manifest.dump(2) + "\n");
  writer.close();
}

const json& field(const json& object, std::string_view name, const fs::path& manifest) {
  const auto found = object.find(name);
  if (found == object.end()) fail(manifest, "field \"" + std::string(name) + "\" is missing; " + std::string(kManifestFix));
  return *found;
}

std::int64_t integer_field(const json& object, std::string_view name, const fs::path& manifest) {
  const json& value = field(object, name, manifest);
  if (!value.is_number_integer()) {
    fail(manifest, "field \"" + std::string(name) + "\" holds " + value.dump() + ", not an integer; " + std::string(kManifestFix));
  }
  return value.get<std::int64_t>();
}

std::string string_field(const json& object, std::string_view name, const fs::path& manifest) {
  const json& value = field(object, name, manifest);
  if (!value.is_string()) {
    fail(manifest, "field \"" + std::string(name) + "\" holds " + value.dump() + ", not a string; " + std::string(kManifestFix));
  }
  return value.get<std::string>();
}

const json& object_field(const json& object, std::string_view name, const fs::path& manifest) {
  const json& value = field(object, name, manifest);
  if (!value.is_object()) {
    fail(manifest, "field \"" + std::string(name) + "\" holds " + value.dump() + ", not an object; " + std::string(kManifestFix));
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
  check_checksum(manifest, path);
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
  if (state.engine != "reference" && state.engine != "production") {
    refuse(path, "engine", state.engine, "it must be \"reference\" or \"production\"");
  }
  state.precision = string_field(manifest, "precision", path);
  if (state.precision != kDtypeF32 && state.precision != kDtypeF64) {
    refuse(path, "precision", state.precision, "it must be \"F32\" or \"F64\" (SPEC 9)");
  }
  state.counters = read_counters(manifest, path);
  if (const std::int64_t iteration = integer_field(manifest, "iteration", path); iteration != state.counters.iteration) {
    refuse(path, "iteration", iteration,
           "it must equal counters.iteration (" + std::to_string(state.counters.iteration) + ")");
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
  if (const std::int64_t step = integer_field(object_field(manifest, "optimizer", path), "step", path);
      step != state.counters.successful_updates) {
    refuse(path, "optimizer.step", step,
           "it must equal counters.successful_updates (" + std::to_string(state.counters.successful_updates) + ")");
  }
  if (const std::int64_t num_samples = integer_field(object_field(manifest, "scheduler", path), "num_samples", path);
      num_samples != state.counters.scheduler_samples) {
    refuse(path, "scheduler.num_samples", num_samples,
           "it must equal counters.scheduler_samples (" + std::to_string(state.counters.scheduler_samples) + ")");
  }
  state.data_position = object_field(manifest, "data_position", path);
  if (const auto next = state.data_position.find("next_global_sample"); next != state.data_position.end()) {
    if (!next->is_number_integer() || next->get<std::int64_t>() != state.counters.consumed_samples) {
      refuse(path, "data_position.next_global_sample", *next,
             "it must equal counters.consumed_samples (" + std::to_string(state.counters.consumed_samples) + ")");
    }
  }
  state.random_streams = object_field(manifest, "random_streams", path);
  state.parallel_layout = object_field(manifest, "parallel_layout", path);
  state.run_config = object_field(manifest, "run_config", path);
  state.extra = object_field(manifest, "extra", path);
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
