// Checkpoint directories: save, load, manifest and verification (core/checkpoint/checkpoint.hpp).
#include "core/checkpoint/checkpoint.hpp"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/safetensors.hpp"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kIterationPrefix = "iter_";

[[noreturn]] void fail(const fs::path& file, const std::string& problem) {
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

void remove_staging_leftovers(const fs::path& save_dir) {
  for (const auto& entry : fs::directory_iterator(save_dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.starts_with(kIterationPrefix) || name.starts_with(kTrackerFileName);
    if (ours && is_staging_name(name)) fs::remove_all(entry.path());
  }
}

// Manifest field access with errors naming the manifest and the field.
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

std::int64_t parse_iteration(std::string_view text, const fs::path& file) {
  std::int64_t iteration = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), iteration);
  if (error != std::errc{} || end != text.data() + text.size() || iteration < 0) {
    fail(file, "holds \"" + std::string(text) +
                   "\", not an iteration number (tandem does not read Megatron's \"release\" "
                   "checkpoints); point --load at an iter_NNNNNNN directory instead");
  }
  return iteration;
}

// Checks that a file's size and CRC-32 match what the manifest recorded.
void verify_file(const fs::path& directory, const json& files, std::string_view name,
                 const fs::path& manifest) {
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
      fail(path, "tensor " + tensor.name + " is " + tensor.dtype +
                     " but the manifest's precision is " + precision);
    }
  }
  return std::move(contents.tensors);
}

}  // namespace

std::string iteration_directory_name(std::int64_t iteration) {
  if (iteration < 0) throw std::invalid_argument("iteration " + std::to_string(iteration) + " is negative");
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

fs::path save_checkpoint(const fs::path& save_dir, const CheckpointState& state,
                         const SaveHooks& hooks) {
  const std::string where = "saving iteration " + std::to_string(state.counters.iteration) +
                            " to " + save_dir.string();
  check_precision(state.precision, where);
  check_tensors_precision(state.model_tensors, state.precision, where);
  check_tensors_precision(state.optimizer_tensors, state.precision, where);
  auto after = [&](std::string_view step) {
    if (hooks.after_step) hooks.after_step(step);
  };

  fs::create_directories(save_dir);
  remove_staging_leftovers(save_dir);
  const fs::path final_dir = save_dir / iteration_directory_name(state.counters.iteration);
  StagedDirectory staged(final_dir);

  const SafetensorsMetadata metadata = file_metadata(state);
  json files = json::object();
  auto record = [&](std::string_view name, const FileDigest& digest, std::size_t tensor_count) {
    files[std::string(name)] = {{"size_bytes", digest.size_bytes},
                                {"crc32", crc32_hex(digest.crc32)},
                                {"tensors", tensor_count}};
  };
  record(kModelFileName,
         write_safetensors(staged.staging_path() / kModelFileName, state.model_tensors, metadata),
         state.model_tensors.size());
  after(kModelFileName);
  record(kOptimizerFileName,
         write_safetensors(staged.staging_path() / kOptimizerFileName, state.optimizer_tensors,
                           metadata),
         state.optimizer_tensors.size());
  after(kOptimizerFileName);

  const json& settings = state.run_config;
  const json manifest{
      {"format", kCheckpointFormat},
      {"format_version", kCheckpointFormatVersion},
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
  FileWriter manifest_writer(staged.staging_path() / kManifestFileName);
  manifest_writer.write(manifest.dump(2) + "\n");
  manifest_writer.close();
  after(kManifestFileName);

  staged.commit();
  after("directory");
  // Megatron writes the bare number; so do we.
  write_file_atomically(save_dir / kTrackerFileName, std::to_string(state.counters.iteration));
  after("tracker");
  return final_dir;
}

std::optional<std::int64_t> read_latest_iteration(const fs::path& save_dir) {
  const fs::path tracker = save_dir / kTrackerFileName;
  std::ifstream in(tracker);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  std::string value = text.str();
  while (!value.empty() && (value.back() == '\n' || value.back() == '\r' || value.back() == ' ')) {
    value.pop_back();
  }
  return parse_iteration(value, tracker);
}

fs::path resolve_checkpoint_directory(const fs::path& load_dir, const LoadOptions& options) {
  std::error_code ignored;
  if (!fs::is_directory(load_dir, ignored)) {
    throw std::runtime_error("checkpoint directory " + load_dir.string() +
                             " does not exist; check --load");
  }
  if (fs::exists(load_dir / kManifestFileName, ignored)) {
    if (options.iteration) {
      const auto name = load_dir.filename().empty() ? load_dir.parent_path().filename()
                                                    : load_dir.filename();
      if (name != iteration_directory_name(*options.iteration)) {
        throw std::runtime_error("checkpoint directory " + load_dir.string() +
                                 " is not iteration " + std::to_string(*options.iteration));
      }
    }
    return load_dir;
  }
  std::optional<std::int64_t> iteration = options.iteration;
  if (!iteration) iteration = read_latest_iteration(load_dir);
  if (!iteration) {
    throw std::runtime_error("checkpoint directory " + load_dir.string() + " holds neither " +
                             std::string(kTrackerFileName) + " nor " + std::string(kManifestFileName) +
                             "; point --load at a --save directory or at one of its iter_ "
                             "directories");
  }
  const fs::path directory = load_dir / iteration_directory_name(*iteration);
  if (!fs::is_directory(directory, ignored)) {
    throw std::runtime_error("checkpoint directory " + directory.string() +
                             " does not exist (the tracker or the requested iteration names it)");
  }
  return directory;
}

CheckpointState load_checkpoint(const fs::path& load_dir, const LoadOptions& options) {
  const fs::path directory = resolve_checkpoint_directory(load_dir, options);
  const fs::path manifest_path = directory / kManifestFileName;
  std::ifstream in(manifest_path);
  if (!in) fail(manifest_path, "cannot be opened; the checkpoint is incomplete");
  json manifest;
  try {
    manifest = json::parse(in);
  } catch (const json::exception& error) {
    fail(manifest_path, std::string("is not valid JSON (truncated or corrupt): ") + error.what());
  }
  if (!manifest.is_object()) fail(manifest_path, "is not a JSON object");
  const std::string format = string_field(manifest, "format", manifest_path);
  if (format != kCheckpointFormat) {
    fail(manifest_path, "format is \"" + format + "\", not \"" + std::string(kCheckpointFormat) + "\"");
  }
  const std::int64_t version = integer_field(manifest, "format_version", manifest_path);
  if (version != kCheckpointFormatVersion) {
    fail(manifest_path, "format_version is " + std::to_string(version) + "; this build reads " +
                            std::to_string(kCheckpointFormatVersion));
  }

  CheckpointState state;
  state.engine = string_field(manifest, "engine", manifest_path);
  state.precision = string_field(manifest, "precision", manifest_path);
  if (state.precision != kDtypeF32 && state.precision != kDtypeF64) {
    fail(manifest_path, "precision \"" + state.precision + "\" is neither F32 nor F64");
  }
  const json& counters = object_field(manifest, "counters", manifest_path);
  state.counters.iteration = integer_field(counters, "iteration", manifest_path);
  state.counters.consumed_samples = integer_field(counters, "consumed_samples", manifest_path);
  state.counters.successful_updates = integer_field(counters, "successful_updates", manifest_path);
  state.counters.skipped_updates = integer_field(counters, "skipped_updates", manifest_path);
  state.counters.consecutive_skips = integer_field(counters, "consecutive_skips", manifest_path);
  state.counters.input_tokens = integer_field(counters, "input_tokens", manifest_path);
  state.counters.loss_tokens = integer_field(counters, "loss_tokens", manifest_path);
  state.counters.pad_tokens = integer_field(counters, "pad_tokens", manifest_path);
  state.counters.scheduler_samples = integer_field(counters, "scheduler_samples", manifest_path);
  if (integer_field(manifest, "iteration", manifest_path) != state.counters.iteration) {
    fail(manifest_path, "iteration and counters.iteration disagree");
  }
  const std::string directory_name = directory.filename().empty()
                                         ? directory.parent_path().filename().string()
                                         : directory.filename().string();
  if (directory_name.starts_with(kIterationPrefix) &&
      directory_name != iteration_directory_name(state.counters.iteration)) {
    fail(manifest_path, "records iteration " + std::to_string(state.counters.iteration) +
                            " but lies in directory " + directory_name);
  }
  // SPEC 7/8: the step count t and the scheduler's n, recorded in their own sections too.
  if (integer_field(object_field(manifest, "optimizer", manifest_path), "step", manifest_path) !=
      state.counters.successful_updates) {
    fail(manifest_path, "optimizer.step and counters.successful_updates disagree");
  }
  if (integer_field(object_field(manifest, "scheduler", manifest_path), "num_samples",
                    manifest_path) != state.counters.scheduler_samples) {
    fail(manifest_path, "scheduler.num_samples and counters.scheduler_samples disagree");
  }
  state.data_position = field(manifest, "data_position", manifest_path);
  state.random_streams = field(manifest, "random_streams", manifest_path);
  state.parallel_layout = field(manifest, "parallel_layout", manifest_path);
  state.run_config = field(manifest, "run_config", manifest_path);
  state.extra = field(manifest, "extra", manifest_path);

  const json& files = object_field(manifest, "files", manifest_path);
  verify_file(directory, files, kModelFileName, manifest_path);
  state.model_tensors = read_tensor_file(directory / kModelFileName, state.precision);
  if (options.read_optimizer) {
    verify_file(directory, files, kOptimizerFileName, manifest_path);
    state.optimizer_tensors = read_tensor_file(directory / kOptimizerFileName, state.precision);
  }
  return state;
}

}  // namespace tandem::checkpoint
