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
#include "core/checkpoint/manifest.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/checkpoint/sharded.hpp"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using manifest::fail;

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
  manifest::check_precision(state.precision, where);
  manifest::check_tensors_precision(state.model_tensors, state.precision, where);
  manifest::check_tensors_precision(state.optimizer_tensors, state.precision, where);
  auto after = [&](std::string_view step) {
    if (hooks.after_step) hooks.after_step(step);
  };

  manifest::prepare_save_directory(save_dir);
  const fs::path final_dir = save_dir / iteration_directory_name(state.counters.iteration);
  StagedDirectory staged(final_dir);

  const SafetensorsMetadata metadata = manifest::file_metadata(state);
  json files = json::object();
  files[std::string(kModelFileName)] = manifest::file_record(
      write_safetensors(staged.staging_path() / kModelFileName, state.model_tensors, metadata),
      state.model_tensors.size());
  after(kModelFileName);
  files[std::string(kOptimizerFileName)] = manifest::file_record(
      write_safetensors(staged.staging_path() / kOptimizerFileName, state.optimizer_tensors, metadata),
      state.optimizer_tensors.size());
  after(kOptimizerFileName);
  manifest::write_manifest(staged.staging_path(), manifest::make_manifest(state, kCheckpointFormatVersion, files));
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
  // Whitespace around the number is stripped, as Megatron's int(f.read().strip()) does.
  std::string value = text.str();
  const auto blank = [](char c) { return c == '\n' || c == '\r' || c == ' ' || c == '\t'; };
  while (!value.empty() && blank(value.back())) value.pop_back();
  std::size_t first = 0;
  while (first < value.size() && blank(value[first])) ++first;
  return parse_iteration(value.substr(first), tracker);
}

bool holds_checkpoint(const fs::path& load_dir) {
  std::error_code ignored;
  return fs::exists(load_dir / kTrackerFileName, ignored) || fs::exists(load_dir / kManifestFileName, ignored);
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
  manifest::ReadManifest read = manifest::read_manifest(directory);
  CheckpointState& state = read.state;
  if (!options.read_tensors) return state;
  if (is_sharded_format_version(read.format_version)) {
    read_sharded_tensors(directory, read, options.read_optimizer);
    return state;
  }
  const json& files = read.json.at("files");
  manifest::verify_file(directory, files, kModelFileName, read.path);
  state.model_tensors = manifest::read_tensor_file(directory / kModelFileName, state.precision);
  if (options.read_optimizer) {
    manifest::verify_file(directory, files, kOptimizerFileName, read.path);
    state.optimizer_tensors = manifest::read_tensor_file(directory / kOptimizerFileName, state.precision);
  }
  return state;
}

}  // namespace tandem::checkpoint
