// The checkpoint directory both twins write and resume from (SPEC 9), laid out as Megatron-LM lays
// out its own so that its users find their way:
//
//   SAVE/latest_checkpointed_iteration.txt   the newest complete iteration, e.g. "42" (Megatron's
//                                            tracker name), replaced atomically after the directory
//   SAVE/iter_0000042/model.safetensors      main weights, Hugging Face Llama names (SPEC 12)
//   SAVE/iter_0000042/optimizer.safetensors  Adam m and v ("exp_avg.NAME", "exp_avg_sq.NAME")
//   SAVE/iter_0000042/manifest.json          everything else, and each file's size and CRC-32;
//                                            written last
//
// That is format_version 1, what one process writes. A production run on several data-parallel
// ranks writes format_version 3 instead (2 until ranks held several ranges; still read): each rank
// its own ranges of the flat main state in `shard_RRRRR_of_NNNNN.safetensors` (sharded.hpp), and
// load_checkpoint reassembles them, so exports and whole-state readers see the same
// CheckpointState either way.
//
// Tensors are stored in the engine's main precision: F64 for the reference, F32 for production.
// A save builds `iter_0000042.tmp-XXXXXX` and renames it into place (atomic_file.hpp), so a new
// checkpoint appears complete or not at all and an interrupted save never damages an older one.
// A load checks the format, every field, each file's size and checksum, and every tensor's dtype,
// and refuses anything else with an error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/tensor_data.hpp"
#include "core/train/records.hpp"

namespace tandem::checkpoint {

inline constexpr std::string_view kCheckpointFormat = "tandem-checkpoint";
inline constexpr std::int64_t kCheckpointFormatVersion = 1;               // whole files
inline constexpr std::int64_t kShardedCheckpointFormatVersion = 2;        // per-rank shards, one range each
inline constexpr std::int64_t kRangedShardedCheckpointFormatVersion = 3;  // per-rank shards, several ranges each
// Whether a checkpoint of this format_version is sharded (sharded.hpp reads both).
constexpr bool is_sharded_format_version(std::int64_t format_version) {
  return format_version == kShardedCheckpointFormatVersion || format_version == kRangedShardedCheckpointFormatVersion;
}
inline constexpr std::string_view kTrackerFileName = "latest_checkpointed_iteration.txt";
inline constexpr std::string_view kManifestFileName = "manifest.json";
inline constexpr std::string_view kModelFileName = "model.safetensors";
inline constexpr std::string_view kOptimizerFileName = "optimizer.safetensors";
// Name prefixes of the Adam moments in optimizer.safetensors: "exp_avg.NAME", "exp_avg_sq.NAME".
inline constexpr std::string_view kExpAvgPrefix = "exp_avg.";
inline constexpr std::string_view kExpAvgSqPrefix = "exp_avg_sq.";

// What a trainer saves and gets back. The JSON members are the trainer's own (the format only
// requires them to be present); everything else is checked on load.
struct CheckpointState {
  std::string engine;              // "reference" or "production"
  std::string precision;           // dtype of every stored tensor: "F64" or "F32" (SPEC 9)
  nlohmann::json run_config;       // to_json(RunConfig) of the run that wrote it (core/config.hpp)
  nlohmann::json parallel_layout;  // the layout the state was written with (TP, PP, DP, ...)
  // Every SPEC 1 counter after `counters.iteration`; the AdamW step t is successful_updates and
  // the scheduler's n is scheduler_samples (the manifest records both under their own sections).
  Counters counters;
  nlohmann::json data_position;    // where the next sample comes from (trainer-defined object)
  nlohmann::json random_streams;   // the state of every random stream (trainer-defined object)
  nlohmann::json extra = nlohmann::json::object();  // anything else the trainer keeps
  std::vector<TensorData> model_tensors;      // main weights, Hugging Face Llama names
  std::vector<TensorData> optimizer_tensors;  // Adam m and v; empty when not loaded

  bool operator==(const CheckpointState&) const = default;
};

// "iter_0000042": Megatron's directory name for an iteration.
std::string iteration_directory_name(std::int64_t iteration);

// For tests only: called after each step of a save with the step's name ("model.safetensors",
// "optimizer.safetensors", "manifest.json" inside the staging directory, then "directory" once it
// is in place, then "tracker"). A hook that throws simulates a failure at that point.
struct SaveHooks {
  std::function<void(std::string_view step)> after_step;
};

// Writes SAVE/iter_NNNNNNN (iteration = state.counters.iteration) atomically, then the tracker.
// An existing directory of the same iteration is replaced atomically. Staging leftovers of an
// earlier interrupted save in `save_dir` are removed first (one process saves into a directory).
// Returns the iteration directory.
std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir,
                                      const CheckpointState& state, const SaveHooks& hooks = {});

struct LoadOptions {
  std::optional<std::int64_t> iteration;  // none: the tracker's (latest) iteration
  bool read_optimizer = true;             // false: skip optimizer.safetensors (exports)
  bool read_tensors = true;               // false: the manifest only (no tensor is read)
};

// The iteration in SAVE/latest_checkpointed_iteration.txt, none when there is no tracker.
std::optional<std::int64_t> read_latest_iteration(const std::filesystem::path& save_dir);

// The directory a load reads: `load_dir` itself when it holds a manifest (an iter_ directory was
// given), else the requested or latest iteration under it. Throws naming what is missing.
// Whether `load_dir` holds a checkpoint to resume: a tracker file (a --save directory) or a
// manifest (an iter_ directory). A missing or empty directory holds none.
bool holds_checkpoint(const std::filesystem::path& load_dir);

std::filesystem::path resolve_checkpoint_directory(const std::filesystem::path& load_dir,
                                                   const LoadOptions& options = {});

// Reads and verifies a checkpoint (see the file comment), either format. Throws naming the file on
// corruption.
CheckpointState load_checkpoint(const std::filesystem::path& load_dir, const LoadOptions& options = {});

}  // namespace tandem::checkpoint
