// Sharded checkpoints: the collective save, the range reads and the whole-state assembly
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

// The tensors of one shard file, each [elements] F32: the file's ranges concatenated.
constexpr std::string_view kMainWeights = "main_weights";
constexpr std::string_view kExpAvg = "exp_avg";
constexpr std::string_view kExpAvgSq = "exp_avg_sq";

// One row of the manifest's "shards.files": a rank's file and the flat ranges its tensors hold,
// concatenated in this (increasing) order.
struct ShardEntry {
  std::string file;
  std::vector<FlatRange> ranges;  // format 2: its one (begin, count), none when count is 0
  std::int64_t elements = 0;      // the ranges' total: the length of each of the file's tensors
  std::string recorded;           // the manifest's fields the ranges came from, for errors
};

// A tensor of the manifest's "flat_layout".
struct FlatTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// A flat range and who holds it, as errors name it ("rank 1's piece 0",
// "shard shard_00001_of_00002.safetensors \"ranges\"[0]").
struct HeldRange {
  FlatRange range;
  std::string holder;
};

// "[4, 6)": a range's elements (only for a range known to lie inside the buffer).
std::string elements_text(const FlatRange& range) {
  return "[" + std::to_string(range.begin) + ", " + std::to_string(range.begin + range.count) + ")";
}

// The first problem of one holder's ranges, which must each be non-empty and inside [0, total),
// and be disjoint and in increasing flat order; "" when there is none.
std::string holder_problem(std::span<const HeldRange> ranges, std::int64_t total) {
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const FlatRange& range = ranges[i].range;
    const std::string stated = ranges[i].holder + " (begin " + std::to_string(range.begin) + ", count " +
                               std::to_string(range.count) + ")";
    if (range.count < 1) return stated + " is empty; every range holds at least one element";
    if (range.begin < 0) return stated + " begins before element 0";
    if (range.count > total - range.begin) {
      return stated + " runs past the end of the flat buffer's " + std::to_string(total) + " elements";
    }
    if (i == 0) continue;
    const FlatRange& previous = ranges[i - 1].range;
    if (range.begin < previous.begin + previous.count) {
      return ranges[i].holder + " " + elements_text(range) + " does not begin after " + ranges[i - 1].holder +
             " " + elements_text(previous) + "; each rank's ranges are disjoint and in increasing flat order";
    }
  }
  return "";
}

// The first overlap or gap of `ranges` (each inside [0, total)) as a tiling of [0, total); ""
// when they tile it exactly.
std::string tiling_problem(std::vector<HeldRange> ranges, std::int64_t total) {
  std::stable_sort(ranges.begin(), ranges.end(),
                   [](const HeldRange& a, const HeldRange& b) { return a.range.begin < b.range.begin; });
  std::int64_t next = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const HeldRange& held = ranges[i];
    if (held.range.begin < next) {  // then ranges[i - 1] ends at `next`: everything before is a tiling
      return held.holder + " " + elements_text(held.range) + " overlaps " + ranges[i - 1].holder + " " +
             elements_text(ranges[i - 1].range);
    }
    if (held.range.begin > next) {
      return "elements [" + std::to_string(next) + ", " + std::to_string(held.range.begin) +
             ") are in no range (the next range is " + held.holder + ")";
    }
    next = held.range.begin + held.range.count;
  }
  if (next != total) {
    return "elements [" + std::to_string(next) + ", " + std::to_string(total) + ") are in no range";
  }
  return "";
}

json ranges_json(std::span<const FlatRange> ranges) {
  json out = json::array();
  for (const FlatRange& range : ranges) out.push_back(json::array({range.begin, range.count}));
  return out;
}

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

// A format 3 shard's "ranges": a list of [begin, count] pairs of integers.
std::vector<FlatRange> read_ranges(const json& entry, const std::string& file, const fs::path& path) {
  const json& ranges = manifest::field(entry, "ranges", path);
  if (!ranges.is_array()) {
    fail(path, "shard " + file + ": field \"ranges\" holds " + ranges.dump() + ", not a list of [begin, count] pairs");
  }
  std::vector<FlatRange> out;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const json& pair = ranges[i];
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() || !pair[1].is_number_integer()) {
      fail(path, "shard " + file + ": \"ranges\"[" + std::to_string(i) + "] holds " + pair.dump() +
                     ", not a [begin, count] pair of integers");
    }
    out.push_back({pair[0].get<std::int64_t>(), pair[1].get<std::int64_t>()});
  }
  return out;
}

// The manifest's shards, in rank order, checked to tile [0, total): format 2's one (begin, count)
// per file in rank order, or format 3's "ranges", each file's increasing, all of them together.
std::vector<ShardEntry> read_shard_entries(const manifest::ReadManifest& read, std::int64_t total) {
  const fs::path& path = read.path;
  const json& shards = manifest::object_field(read.json, "shards", path);
  const std::int64_t ranks = manifest::integer_field(shards, "ranks", path);
  const json& files = manifest::field(shards, "files", path);
  if (!files.is_array() || static_cast<std::int64_t>(files.size()) != ranks) {
    fail(path, "shards.files must list one file for each of the " + std::to_string(ranks) + " ranks");
  }
  const bool one_range = read.format_version == kShardedCheckpointFormatVersion;
  std::vector<ShardEntry> out;
  std::vector<HeldRange> all;  // format 3
  std::int64_t next = 0;       // format 2
  for (const json& entry : files) {
    ShardEntry shard;
    shard.file = manifest::string_field(entry, "file", path);
    const std::int64_t rank = manifest::integer_field(entry, "rank", path);
    const auto position = static_cast<std::int64_t>(out.size());
    if (one_range) {
      const std::int64_t begin = manifest::integer_field(entry, "begin", path);
      const std::int64_t count = manifest::integer_field(entry, "count", path);
      if (rank != position || begin != next || count < 0) {
        fail(path, "shard " + shard.file + " (rank " + std::to_string(rank) + ", begin " + std::to_string(begin) +
                       ", count " + std::to_string(count) + ") does not continue the shards before it at element " +
                       std::to_string(next));
      }
      next += count;
      if (count > 0) shard.ranges.push_back({begin, count});
      shard.recorded = "\"begin\" " + std::to_string(begin) + ", \"count\" " + std::to_string(count);
    } else {
      if (rank != position) {
        fail(path, "shard " + shard.file + " says rank " + std::to_string(rank) + " at position " +
                       std::to_string(position) + " of shards.files; the files are listed in rank order");
      }
      shard.ranges = read_ranges(entry, shard.file, path);
      std::vector<HeldRange> held;
      for (std::size_t i = 0; i < shard.ranges.size(); ++i) {
        held.push_back({shard.ranges[i], "shard " + shard.file + " \"ranges\"[" + std::to_string(i) + "]"});
      }
      if (const std::string problem = holder_problem(held, total); !problem.empty()) fail(path, problem);
      all.insert(all.end(), held.begin(), held.end());
      shard.recorded = "\"ranges\" " + ranges_json(shard.ranges).dump();
    }
    for (const FlatRange& range : shard.ranges) shard.elements += range.count;
    out.push_back(std::move(shard));
  }
  if (one_range && next != total) {
    fail(path, "the shards cover " + std::to_string(next) + " elements, the flat layout " + std::to_string(total));
  }
  if (!one_range) {
    if (const std::string problem = tiling_problem(std::move(all), total); !problem.empty()) {
      fail(path, "shards: " + problem + "; the shards' \"ranges\" must tile the flat buffer [0, " +
                     std::to_string(total) + ") exactly");
    }
  }
  return out;
}

// The three tensors of one shard file, each [shard.elements].
struct ShardValues {
  std::vector<float> params;
  std::vector<float> exp_avg;
  std::vector<float> exp_avg_sq;
};

// Verifies and reads one shard file.
ShardValues read_shard(const fs::path& directory, const manifest::ReadManifest& read, const ShardEntry& shard) {
  manifest::verify_file(directory, read.json.at("files"), shard.file, read.path);
  const fs::path path = directory / shard.file;
  const std::vector<TensorData> tensors = manifest::read_tensor_file(path, std::string(kDtypeF32));
  auto values = [&](std::string_view name) {
    const TensorData& tensor = find_tensor(tensors, name, path.string());
    if (tensor.shape != std::vector<std::int64_t>{shard.elements}) {
      fail(path, "tensor " + tensor.name + " has shape " + json(tensor.shape).dump() + ", but the manifest's " +
                     shard.recorded + " for this file hold " + std::to_string(shard.elements) +
                     " elements; the file and the manifest disagree");
    }
    return f32_values(tensor);
  };
  return {values(kMainWeights), values(kExpAvg), values(kExpAvgSq)};
}

// Flat elements [begin, begin + params.size()) of the main state, viewed in place.
struct StateView {
  std::int64_t begin = 0;
  std::span<const float> params;
  std::span<const float> exp_avg;
  std::span<const float> exp_avg_sq;
};

// Copies the overlap of `from` into `into`.
void copy_overlap(const StateView& from, MainStateSlice<float>& into) {
  const auto from_end = from.begin + static_cast<std::int64_t>(from.params.size());
  const auto into_end = into.begin + static_cast<std::int64_t>(into.params.size());
  const std::int64_t first = std::max(from.begin, into.begin);
  const std::int64_t last = std::min(from_end, into_end);
  if (first >= last) return;
  auto copy = [&](std::span<const float> source, std::vector<float>& target) {
    std::copy(source.begin() + (first - from.begin), source.begin() + (last - from.begin),
              target.begin() + (first - into.begin));
  };
  copy(from.params, into.params);
  copy(from.exp_avg, into.exp_avg);
  copy(from.exp_avg_sq, into.exp_avg_sq);
}

bool overlaps(const FlatRange& a, const FlatRange& b) {
  return a.count > 0 && b.count > 0 && a.begin < b.begin + b.count && b.begin < a.begin + a.count;
}

// Fills each of `outs` (sized, at its begin) from a format 2 or 3 checkpoint of `total` elements,
// reading and verifying each shard file that holds any of their elements once.
void read_shards_into(const fs::path& directory, const manifest::ReadManifest& read, std::int64_t total,
                      std::vector<MainStateSlice<float>>& outs) {
  std::vector<FlatRange> wanted;
  for (const auto& out : outs) wanted.push_back({out.begin, static_cast<std::int64_t>(out.params.size())});
  for (const ShardEntry& shard : read_shard_entries(read, total)) {
    const bool needed = std::any_of(shard.ranges.begin(), shard.ranges.end(), [&](const FlatRange& held) {
      return std::any_of(wanted.begin(), wanted.end(), [&](const FlatRange& want) { return overlaps(held, want); });
    });
    if (!needed) continue;
    const ShardValues values = read_shard(directory, read, shard);
    std::size_t offset = 0;
    for (const FlatRange& range : shard.ranges) {
      const auto count = static_cast<std::size_t>(range.count);
      const StateView view{range.begin, std::span<const float>(values.params).subspan(offset, count),
                           std::span<const float>(values.exp_avg).subspan(offset, count),
                           std::span<const float>(values.exp_avg_sq).subspan(offset, count)};
      for (auto& out : outs) copy_overlap(view, out);
      offset += count;
    }
  }
}

// The ranges of a rank's pieces; throws when a piece's three parts differ in size.
std::vector<FlatRange> ranges_of(std::span<const MainStateSlice<float>> pieces) {
  std::vector<FlatRange> out;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const MainStateSlice<float>& piece = pieces[i];
    if (piece.exp_avg.size() != piece.params.size() || piece.exp_avg_sq.size() != piece.params.size()) {
      throw std::invalid_argument("piece " + std::to_string(i) + " (begin " + std::to_string(piece.begin) + ") has " +
                                  std::to_string(piece.params.size()) + " main weights, " +
                                  std::to_string(piece.exp_avg.size()) + " exp_avg and " +
                                  std::to_string(piece.exp_avg_sq.size()) +
                                  " exp_avg_sq; a piece's three parts have one size");
    }
    out.push_back({piece.begin, static_cast<std::int64_t>(piece.params.size())});
  }
  return out;
}

// The first reason the ranks' ranges (rank_ranges[r]: rank r's pieces) do not tile [0, total),
// each rank's in increasing order; "" when they do.
std::string partition_problem(const std::vector<std::vector<FlatRange>>& rank_ranges, std::int64_t total) {
  std::vector<HeldRange> all;
  for (std::size_t rank = 0; rank < rank_ranges.size(); ++rank) {
    std::vector<HeldRange> held;
    for (std::size_t i = 0; i < rank_ranges[rank].size(); ++i) {
      held.push_back({rank_ranges[rank][i], "rank " + std::to_string(rank) + "'s piece " + std::to_string(i)});
    }
    if (std::string problem = holder_problem(held, total); !problem.empty()) return problem;
    all.insert(all.end(), held.begin(), held.end());
  }
  return tiling_problem(std::move(all), total);
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
                                 std::span<const MainStateSlice<float>> pieces, const RankExchange& ranks,
                                 const SaveHooks& hooks) {
  const std::string where = "saving iteration " + std::to_string(state.counters.iteration) + " to " +
                            save_dir.string() + " (sharded)";
  if (state.precision != kDtypeF32 || !state.model_tensors.empty() || !state.optimizer_tensors.empty()) {
    throw std::invalid_argument(where + ": a sharded save takes an F32 state without tensor lists");
  }
  auto after = [&](std::string_view step) {
    if (hooks.after_step) hooks.after_step(step);
  };
  const fs::path final_dir = save_dir / iteration_directory_name(state.counters.iteration);
  const bool lead = ranks.rank == 0;

  // 1. Each rank states its pieces' ranges, and rank 0 makes the staging directory; every rank
  // learns every statement (or failure) and checks the same ranges alike, so a partition that
  // does not tile the buffer fails every rank before any file is written.
  std::optional<StagedDirectory> staged;
  std::string stated;
  try {
    json statement{{"ranges", ranges_json(ranges_of(pieces))}};
    if (lead) {
      manifest::prepare_save_directory(save_dir);
      staged.emplace(final_dir);
      statement["staging"] = staged->staging_path().string();
    }
    stated = statement.dump();
  } catch (const std::exception& error) {
    stated = error_message(error);
  }
  const std::vector<std::string> statements = ranks.all_gather(stated);
  std::vector<std::vector<FlatRange>> rank_ranges(statements.size());
  std::string failures;
  for (std::size_t rank = 0; rank < statements.size(); ++rank) {
    const json statement = json::parse(statements[rank]);
    if (statement.contains("error")) {
      failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + ": " +
                  statement["error"].get<std::string>();
      continue;
    }
    for (const json& pair : statement.at("ranges")) {
      rank_ranges[rank].push_back({pair.at(0).get<std::int64_t>(), pair.at(1).get<std::int64_t>()});
    }
  }
  if (!failures.empty()) throw std::runtime_error(where + ": " + failures);  // rank 0's staging goes
  if (const std::string problem = partition_problem(rank_ranges, layout.total_elements); !problem.empty()) {
    throw std::runtime_error(where + ": " + problem + "; the ranks' pieces must tile the flat buffer [0, " +
                             std::to_string(layout.total_elements) + ") exactly");
  }
  const fs::path staging = json::parse(statements.front()).at("staging").get<std::string>();
  const std::vector<FlatRange>& mine = rank_ranges[static_cast<std::size_t>(ranks.rank)];

  // 2. Each rank writes and fsyncs its shard, its pieces concatenated; every rank learns every
  // outcome.
  const std::string file = shard_file_name(ranks.rank, ranks.size);
  std::string written;
  try {
    std::error_code ignored;
    if (!fs::is_directory(staging, ignored)) {
      throw std::runtime_error("the staging directory " + staging.string() +
                               " that rank 0 created is not visible here; every rank must see the same "
                               "--save directory (a shared filesystem)");
    }
    std::int64_t elements = 0;
    for (const FlatRange& range : mine) elements += range.count;
    // One concatenation at a time, so the save holds at most one extra copy of one tensor.
    auto concatenated = [&](std::string_view name, std::vector<float> MainStateSlice<float>::*part) {
      std::vector<float> values;  // [elements]
      values.reserve(static_cast<std::size_t>(elements));
      for (const MainStateSlice<float>& piece : pieces) values.insert(values.end(), (piece.*part).begin(), (piece.*part).end());
      return make_f32_tensor(std::string(name), {elements}, values);
    };
    const std::vector<TensorData> tensors{concatenated(kMainWeights, &MainStateSlice<float>::params),
                                          concatenated(kExpAvg, &MainStateSlice<float>::exp_avg),
                                          concatenated(kExpAvgSq, &MainStateSlice<float>::exp_avg_sq)};
    SafetensorsMetadata metadata = manifest::file_metadata(state);
    metadata["rank"] = std::to_string(ranks.rank);
    metadata["ranks"] = std::to_string(ranks.size);
    metadata["flat_ranges"] = ranges_json(mine).dump();
    const FileDigest digest = write_safetensors(staging / file, tensors, metadata);
    after(file);
    written = json{{"record", manifest::file_record(digest, tensors.size())}}.dump();
  } catch (const std::exception& error) {
    written = error_message(error);
  }
  const std::vector<std::string> outcomes = ranks.all_gather(written);
  std::vector<json> records;
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    json outcome = json::parse(outcomes[rank]);
    if (outcome.contains("error")) {
      failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + ": " +
                  outcome["error"].get<std::string>();
    }
    records.push_back(std::move(outcome));
  }
  if (!failures.empty()) throw std::runtime_error(where + ": " + failures);  // rank 0's staging goes

  // 3. Rank 0 writes the manifest, renames the directory into place and replaces the tracker.
  std::string committed = json{{"done", true}}.dump();
  if (lead) {
    try {
      json files = json::object();
      json entries = json::array();
      for (std::size_t rank = 0; rank < records.size(); ++rank) {
        const std::string name = shard_file_name(static_cast<int>(rank), ranks.size);
        files[name] = records[rank].at("record");
        entries.push_back({{"file", name}, {"rank", rank}, {"ranges", ranges_json(rank_ranges[rank])}});
      }
      const json sections{{"flat_layout", layout_json(layout)}, {"shards", {{"ranks", ranks.size}, {"files", entries}}}};
      manifest::write_manifest(staged->staging_path(),
                               manifest::make_manifest(state, kRangedShardedCheckpointFormatVersion, files, sections));
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

std::vector<MainStateSlice<float>> read_main_state_pieces(const fs::path& directory, const ModelLayout& layout,
                                                          std::span<const FlatRange> ranges) {
  const manifest::ReadManifest read = manifest::read_manifest(directory);
  if (read.state.precision != kDtypeF32) {
    fail(read.path, "holds the main state in " + read.state.precision +
                        " (the " + read.state.engine + " engine); only F32 checkpoints are read by range");
  }
  std::vector<MainStateSlice<float>> out;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const FlatRange& range = ranges[i];
    if (range.begin < 0 || range.count < 0 || range.count > layout.total_elements - range.begin) {
      throw std::invalid_argument("read_main_state_pieces: ranges[" + std::to_string(i) + "] (begin " +
                                  std::to_string(range.begin) + ", count " + std::to_string(range.count) +
                                  ") is not inside the flat buffer [0, " + std::to_string(layout.total_elements) +
                                  ") of this model");
    }
    const auto size = static_cast<std::size_t>(range.count);
    out.push_back({range.begin, std::vector<float>(size), std::vector<float>(size), std::vector<float>(size)});
  }

  if (is_sharded_format_version(read.format_version)) {
    const std::vector<FlatTensor> saved = read_flat_layout(read.json, read.path);
    check_layout(saved, layout, read.path);
    read_shards_into(directory, read, total_of(saved), out);
    return out;
  }

  // Format 1: whole tensors under their names; each tensor overlapping a range contributes.
  const json& files = read.json.at("files");
  manifest::verify_file(directory, files, kModelFileName, read.path);
  manifest::verify_file(directory, files, kOptimizerFileName, read.path);
  const auto model = manifest::read_tensor_file(directory / kModelFileName, read.state.precision);
  const auto optimizer = manifest::read_tensor_file(directory / kOptimizerFileName, read.state.precision);
  for (const auto& tensor : layout.tensors) {
    const FlatRange held{tensor.offset, tensor.numel};
    if (std::none_of(ranges.begin(), ranges.end(), [&](const FlatRange& range) { return overlaps(held, range); })) {
      continue;
    }
    auto values = [&](const std::vector<TensorData>& tensors, const std::string& name, std::string_view file) {
      const TensorData& stored = find_tensor(tensors, name, (directory / file).string());
      if (stored.shape != tensor.shape) {
        fail(directory / file, "tensor " + name + " has a different shape than this run's model; fix: resume "
                               "with the model configuration the checkpoint was written with");
      }
      return f32_values(stored);
    };
    const std::vector<float> params = values(model, tensor.name, kModelFileName);
    const std::vector<float> exp_avg = values(optimizer, std::string(kExpAvgPrefix) + tensor.name, kOptimizerFileName);
    const std::vector<float> exp_avg_sq =
        values(optimizer, std::string(kExpAvgSqPrefix) + tensor.name, kOptimizerFileName);
    const StateView whole{tensor.offset, params, exp_avg, exp_avg_sq};
    for (auto& piece : out) copy_overlap(whole, piece);
  }
  return out;
}

MainStateSlice<float> read_main_state_slice(const fs::path& directory, const ModelLayout& layout,
                                            std::int64_t begin, std::int64_t count) {
  const FlatRange range{begin, count};
  return std::move(read_main_state_pieces(directory, layout, std::span<const FlatRange>(&range, 1)).front());
}

void read_sharded_tensors(const fs::path& directory, manifest::ReadManifest& read, bool read_optimizer) {
  if (read.state.precision != kDtypeF32) {
    fail(read.path, "a sharded checkpoint must be F32, this one says " + read.state.precision);
  }
  const std::vector<FlatTensor> layout = read_flat_layout(read.json, read.path);
  const std::int64_t total = total_of(layout);
  const auto size = static_cast<std::size_t>(total);
  std::vector<MainStateSlice<float>> wholes{
      {0, std::vector<float>(size), std::vector<float>(size), std::vector<float>(size)}};
  read_shards_into(directory, read, total, wholes);
  const MainStateSlice<float>& whole = wholes.front();
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
