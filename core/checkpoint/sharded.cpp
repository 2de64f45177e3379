// Sharded checkpoints: the collective save, the range read and the whole-state assembly
// (sharded.hpp).
#include "core/checkpoint/sharded.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <system_error>

#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/safetensors.hpp"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using manifest::fail;

// The tensors of one shard file, each [count] F32.
constexpr std::string_view kMainWeights = "main_weights";
constexpr std::string_view kExpAvg = "exp_avg";
constexpr std::string_view kExpAvgSq = "exp_avg_sq";

// One row of the manifest's "shards.files".
struct ShardEntry {
  std::string file;
  std::int64_t rank = 0;
  std::int64_t begin = 0;
  std::int64_t count = 0;
};

// A tensor of the manifest's "flat_layout".
struct FlatTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

json layout_json(const ModelLayout& layout) {
  json tensors = json::array();
  for (const auto& tensor : layout.tensors) {
    tensors.push_back({{"name", tensor.name}, {"shape", tensor.shape}, {"offset", tensor.offset}});
  }
  return tensors;
}

std::vector<FlatTensor> read_flat_layout(const json& manifest_json, const fs::path& path) {
  const json& tensors = manifest::field(manifest_json, "flat_layout", path);
  if (!tensors.is_array()) fail(path, "field \"flat_layout\" is not an array");
  std::vector<FlatTensor> out;
  std::int64_t next = 0;
  for (const json& entry : tensors) {
    FlatTensor tensor;
    tensor.name = manifest::string_field(entry, "name", path);
    tensor.offset = manifest::integer_field(entry, "offset", path);
    const json& shape = manifest::field(entry, "shape", path);
    if (!shape.is_array()) fail(path, "flat_layout: the shape of " + tensor.name + " is not an array");
    for (const json& dimension : shape) {
      if (!dimension.is_number_integer()) fail(path, "flat_layout: the shape of " + tensor.name + " holds " + dimension.dump());
      tensor.shape.push_back(dimension.get<std::int64_t>());
    }
    tensor.numel = element_count(tensor.shape);
    if (tensor.offset != next) {
      fail(path, "flat_layout: " + tensor.name + " begins at " + std::to_string(tensor.offset) +
                     ", not where the tensor before it ends (" + std::to_string(next) + ")");
    }
    next += tensor.numel;
    out.push_back(std::move(tensor));
  }
  return out;
}

// The checkpoint was written for `layout` (names, shapes and offsets), or an error naming the
// first tensor that differs.
void check_layout(const std::vector<FlatTensor>& saved, const ModelLayout& layout, const fs::path& path) {
  const std::size_t common = std::min(saved.size(), layout.tensors.size());
  for (std::size_t i = 0; i < common; ++i) {
    const auto& mine = layout.tensors[i];
    if (saved[i].name != mine.name || saved[i].shape != mine.shape || saved[i].offset != mine.offset) {
      fail(path, "tensor " + std::to_string(i) + " of its flat layout is " + saved[i].name + " " +
                     json(saved[i].shape).dump() + ", this run's model has " + mine.name + " " +
                     json(mine.shape).dump() +
                     "; fix: resume with the model configuration the checkpoint was written with");
    }
  }
  if (saved.size() != layout.tensors.size()) {
    fail(path, "its flat layout has " + std::to_string(saved.size()) + " tensors, this run's model " +
                   std::to_string(layout.tensors.size()) +
                   "; fix: resume with the model configuration the checkpoint was written with");
  }
}

std::int64_t total_of(const std::vector<FlatTensor>& tensors) {
  return tensors.empty() ? 0 : tensors.back().offset + tensors.back().numel;
}

// The manifest's shards, checked to tile [0, total) in rank order.
std::vector<ShardEntry> read_shard_entries(const json& manifest_json, const fs::path& path, std::int64_t total) {
  const json& shards = manifest::object_field(manifest_json, "shards", path);
  const std::int64_t ranks = manifest::integer_field(shards, "ranks", path);
  const json& files = manifest::field(shards, "files", path);
  if (!files.is_array() || static_cast<std::int64_t>(files.size()) != ranks) {
    fail(path, "shards.files must list one file for each of the " + std::to_string(ranks) + " ranks");
  }
  std::vector<ShardEntry> out;
  std::int64_t next = 0;
  for (const json& entry : files) {
    ShardEntry shard{manifest::string_field(entry, "file", path), manifest::integer_field(entry, "rank", path),
                     manifest::integer_field(entry, "begin", path), manifest::integer_field(entry, "count", path)};
    if (shard.rank != static_cast<std::int64_t>(out.size()) || shard.begin != next || shard.count < 0) {
      fail(path, "shard " + shard.file + " (rank " + std::to_string(shard.rank) + ", begin " +
                     std::to_string(shard.begin) + ", count " + std::to_string(shard.count) +
                     ") does not continue the shards before it at element " + std::to_string(next));
    }
    next += shard.count;
    out.push_back(std::move(shard));
  }
  if (next != total) {
    fail(path, "the shards cover " + std::to_string(next) + " elements, the flat layout " + std::to_string(total));
  }
  return out;
}

// Verifies and reads one shard file: its three [count] tensors.
MainStateSlice<float> read_shard(const fs::path& directory, const manifest::ReadManifest& read, const ShardEntry& shard) {
  manifest::verify_file(directory, read.json.at("files"), shard.file, read.path);
  const fs::path path = directory / shard.file;
  const std::vector<TensorData> tensors = manifest::read_tensor_file(path, std::string(kDtypeF32));
  auto values = [&](std::string_view name) {
    const TensorData& tensor = find_tensor(tensors, name, path.string());
    if (tensor.shape != std::vector<std::int64_t>{shard.count}) {
      fail(path, "tensor " + tensor.name + " has shape " + json(tensor.shape).dump() + ", the manifest says [" +
                     std::to_string(shard.count) + "]");
    }
    return f32_values(tensor);
  };
  return {shard.begin, values(kMainWeights), values(kExpAvg), values(kExpAvgSq)};
}

// Copies the overlap of `from` (elements [from.begin, +size)) into `into`.
void copy_overlap(const MainStateSlice<float>& from, MainStateSlice<float>& into) {
  const auto from_end = from.begin + static_cast<std::int64_t>(from.params.size());
  const auto into_end = into.begin + static_cast<std::int64_t>(into.params.size());
  const std::int64_t first = std::max(from.begin, into.begin);
  const std::int64_t last = std::min(from_end, into_end);
  if (first >= last) return;
  auto copy = [&](const std::vector<float>& source, std::vector<float>& target) {
    std::copy(source.begin() + (first - from.begin), source.begin() + (last - from.begin),
              target.begin() + (first - into.begin));
  };
  copy(from.params, into.params);
  copy(from.exp_avg, into.exp_avg);
  copy(from.exp_avg_sq, into.exp_avg_sq);
}

// A failure message as it travels between ranks, and its decoding.
std::string error_message(const std::exception& error) { return json{{"error", error.what()}}.dump(); }

}  // namespace

std::string shard_file_name(int rank, int ranks) {
  char name[64];
  std::snprintf(name, sizeof name, "shard_%05d_of_%05d.safetensors", rank, ranks);
  return name;
}

fs::path save_sharded_checkpoint(const fs::path& save_dir, const CheckpointState& state, const ModelLayout& layout,
                                 const MainStateSlice<float>& slice, const RankExchange& ranks,
                                 const SaveHooks& hooks) {
  const std::string where = "saving iteration " + std::to_string(state.counters.iteration) + " to " +
                            save_dir.string() + " (sharded)";
  if (state.precision != kDtypeF32 || !state.model_tensors.empty() || !state.optimizer_tensors.empty() ||
      slice.exp_avg.size() != slice.params.size() || slice.exp_avg_sq.size() != slice.params.size()) {
    throw std::invalid_argument(where + ": a sharded save takes an F32 state without tensor lists and a "
                                        "slice whose three parts have one size");
  }
  auto after = [&](std::string_view step) {
    if (hooks.after_step) hooks.after_step(step);
  };
  const fs::path final_dir = save_dir / iteration_directory_name(state.counters.iteration);
  const bool lead = ranks.rank == 0;

  // 1. Rank 0 makes the staging directory; every rank learns its name (or rank 0's failure).
  std::optional<StagedDirectory> staged;
  std::string prepared;
  if (lead) {
    try {
      manifest::prepare_save_directory(save_dir);
      staged.emplace(final_dir);
      prepared = json{{"staging", staged->staging_path().string()}}.dump();
    } catch (const std::exception& error) {
      prepared = error_message(error);
    }
  }
  const json staging_message = json::parse(ranks.all_gather(prepared).front());
  if (staging_message.contains("error")) {
    throw std::runtime_error(where + ": rank 0: " + staging_message["error"].get<std::string>());
  }
  const fs::path staging = staging_message.at("staging").get<std::string>();

  // 2. Each rank writes and fsyncs its shard; every rank learns every outcome.
  const std::string file = shard_file_name(ranks.rank, ranks.size);
  std::string written;
  try {
    std::error_code ignored;
    if (!fs::is_directory(staging, ignored)) {
      throw std::runtime_error("the staging directory " + staging.string() +
                               " that rank 0 created is not visible here; every rank must see the same "
                               "--save directory (a shared filesystem)");
    }
    const auto count = static_cast<std::int64_t>(slice.params.size());
    const std::vector<TensorData> tensors{make_f32_tensor(std::string(kMainWeights), {count}, slice.params),
                                          make_f32_tensor(std::string(kExpAvg), {count}, slice.exp_avg),
                                          make_f32_tensor(std::string(kExpAvgSq), {count}, slice.exp_avg_sq)};
    SafetensorsMetadata metadata = manifest::file_metadata(state);
    metadata["rank"] = std::to_string(ranks.rank);
    metadata["ranks"] = std::to_string(ranks.size);
    metadata["flat_begin"] = std::to_string(slice.begin);
    metadata["flat_count"] = std::to_string(count);
    const FileDigest digest = write_safetensors(staging / file, tensors, metadata);
    after(file);
    written = json{{"begin", slice.begin}, {"count", count}, {"record", manifest::file_record(digest, tensors.size())}}.dump();
  } catch (const std::exception& error) {
    written = error_message(error);
  }
  const std::vector<std::string> outcomes = ranks.all_gather(written);
  std::vector<json> shards;
  std::string failures;
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    json outcome = json::parse(outcomes[rank]);
    if (outcome.contains("error")) {
      failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + ": " +
                  outcome["error"].get<std::string>();
    }
    shards.push_back(std::move(outcome));
  }
  if (!failures.empty()) throw std::runtime_error(where + ": " + failures);  // rank 0's staging goes

  // 3. Rank 0 writes the manifest, renames the directory into place and replaces the tracker.
  std::string committed = json{{"done", true}}.dump();
  if (lead) {
    try {
      json files = json::object();
      json entries = json::array();
      std::int64_t next = 0;
      for (std::size_t rank = 0; rank < shards.size(); ++rank) {
        const std::int64_t begin = shards[rank].at("begin").get<std::int64_t>();
        const std::int64_t count = shards[rank].at("count").get<std::int64_t>();
        if (begin != next) {
          throw std::logic_error("rank " + std::to_string(rank) + "'s slice begins at " + std::to_string(begin) +
                                 ", not at " + std::to_string(next) + ": the slices must tile the flat buffer");
        }
        next += count;
        const std::string name = shard_file_name(static_cast<int>(rank), ranks.size);
        files[name] = shards[rank].at("record");
        entries.push_back({{"file", name}, {"rank", rank}, {"begin", begin}, {"count", count}});
      }
      if (next != layout.total_elements) {
        throw std::logic_error("the slices cover " + std::to_string(next) + " of " +
                               std::to_string(layout.total_elements) + " elements");
      }
      const json sections{{"flat_layout", layout_json(layout)}, {"shards", {{"ranks", ranks.size}, {"files", entries}}}};
      manifest::write_manifest(staged->staging_path(),
                               manifest::make_manifest(state, kShardedCheckpointFormatVersion, files, sections));
      after(kManifestFileName);
      staged->commit();
      after("directory");
      write_file_atomically(save_dir / kTrackerFileName, std::to_string(state.counters.iteration));
      after("tracker");
    } catch (const std::exception& error) {
      committed = error_message(error);
    }
  }
  const json outcome = json::parse(ranks.all_gather(committed).front());
  if (outcome.contains("error")) throw std::runtime_error(where + ": rank 0: " + outcome["error"].get<std::string>());
  return final_dir;
}

MainStateSlice<float> read_main_state_slice(const fs::path& directory, const ModelLayout& layout,
                                            std::int64_t begin, std::int64_t count) {
  const manifest::ReadManifest read = manifest::read_manifest(directory);
  if (read.state.precision != kDtypeF32) {
    fail(read.path, "holds the main state in " + read.state.precision +
                        " (the " + read.state.engine + " engine); only F32 checkpoints are read by range");
  }
  if (begin < 0 || count < 0 || begin + count > layout.total_elements) {
    throw std::invalid_argument("read_main_state_slice: elements [" + std::to_string(begin) + ", " +
                                std::to_string(begin + count) + ") of a model of " +
                                std::to_string(layout.total_elements));
  }
  const auto size = static_cast<std::size_t>(count);
  MainStateSlice<float> out{begin, std::vector<float>(size), std::vector<float>(size), std::vector<float>(size)};

  if (read.format_version == kShardedCheckpointFormatVersion) {
    const std::vector<FlatTensor> saved = read_flat_layout(read.json, read.path);
    check_layout(saved, layout, read.path);
    for (const ShardEntry& shard : read_shard_entries(read.json, read.path, total_of(saved))) {
      if (shard.count == 0 || shard.begin >= begin + count || shard.begin + shard.count <= begin) continue;
      copy_overlap(read_shard(directory, read, shard), out);
    }
    return out;
  }

  // Format 1: whole tensors under their names; each tensor overlapping the range contributes.
  const json& files = read.json.at("files");
  manifest::verify_file(directory, files, kModelFileName, read.path);
  manifest::verify_file(directory, files, kOptimizerFileName, read.path);
  const auto model = manifest::read_tensor_file(directory / kModelFileName, read.state.precision);
  const auto optimizer = manifest::read_tensor_file(directory / kOptimizerFileName, read.state.precision);
  for (const auto& tensor : layout.tensors) {
    if (tensor.offset >= begin + count || tensor.offset + tensor.numel <= begin) continue;
    auto values = [&](const std::vector<TensorData>& tensors, const std::string& name, std::string_view file) {
      const TensorData& stored = find_tensor(tensors, name, (directory / file).string());
      if (stored.shape != tensor.shape) {
        fail(directory / file, "tensor " + name + " has a different shape than this run's model; fix: resume "
                               "with the model configuration the checkpoint was written with");
      }
      return f32_values(stored);
    };
    const MainStateSlice<float> whole{tensor.offset, values(model, tensor.name, kModelFileName),
                                      values(optimizer, std::string(kExpAvgPrefix) + tensor.name, kOptimizerFileName),
                                      values(optimizer, std::string(kExpAvgSqPrefix) + tensor.name, kOptimizerFileName)};
    copy_overlap(whole, out);
  }
  return out;
}

void read_sharded_tensors(const fs::path& directory, manifest::ReadManifest& read, bool read_optimizer) {
  if (read.state.precision != kDtypeF32) {
    fail(read.path, "a sharded checkpoint must be F32, this one says " + read.state.precision);
  }
  const std::vector<FlatTensor> layout = read_flat_layout(read.json, read.path);
  const std::int64_t total = total_of(layout);
  const auto size = static_cast<std::size_t>(total);
  MainStateSlice<float> whole{0, std::vector<float>(size), std::vector<float>(size), std::vector<float>(size)};
  for (const ShardEntry& shard : read_shard_entries(read.json, read.path, total)) {
    if (shard.count > 0) copy_overlap(read_shard(directory, read, shard), whole);
  }
  CheckpointState& state = read.state;
  state.model_tensors.clear();
  state.optimizer_tensors.clear();
  for (const FlatTensor& tensor : layout) {
    auto part = [&](const std::vector<float>& flat) {
      return std::span<const float>(flat).subspan(static_cast<std::size_t>(tensor.offset),
                                                  static_cast<std::size_t>(tensor.numel));
    };
    state.model_tensors.push_back(make_f32_tensor(tensor.name, tensor.shape, part(whole.params)));
    if (read_optimizer) {
      state.optimizer_tensors.push_back(
          make_f32_tensor(std::string(kExpAvgPrefix) + tensor.name, tensor.shape, part(whole.exp_avg)));
      state.optimizer_tensors.push_back(
          make_f32_tensor(std::string(kExpAvgSqPrefix) + tensor.name, tensor.shape, part(whole.exp_avg_sq)));
    }
  }
  // The order read_safetensors returns a one-dtype file in: by name.
  auto by_name = [](const TensorData& a, const TensorData& b) { return a.name < b.name; };
  std::sort(state.model_tensors.begin(), state.model_tensors.end(), by_name);
  std::sort(state.optimizer_tensors.begin(), state.optimizer_tensors.end(), by_name);
}

}  // namespace tandem::checkpoint
