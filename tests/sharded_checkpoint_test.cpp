// Sharded checkpoints with several flat ranges per rank (core/checkpoint/sharded.hpp, format 3):
// the distributed optimizer's per-bucket sharding, where DP rank r owns the r-th slice of every
// gradient bucket. Ranks are threads of one thread group (production/collectives/), exchanging as
// a multi-rank save does. The model is a 10-element flat buffer of two tensors, "a" [2, 3] and
// "b" [4], whose every value is known (a dyadic fraction of its flat index).
//
// Every comparison here is exact: values bit for bit (they are exact in float), manifests field
// by field, errors by the file, field and rule they must name.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/manifest.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/checkpoint/sharded.hpp"
#include "production/collectives/collectives.hpp"
#include "production/collectives/thread_group.hpp"
#include "tests/support/files.hpp"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Pieces = std::vector<MainStateSlice<float>>;

constexpr std::int64_t kElements = 10;  // N

// "a" [2, 3] at 0 and "b" [4] at 6: N = 10.
ModelLayout ten_element_layout() {
  ModelLayout layout;
  layout.tensors.push_back({.name = "a", .shape = {2, 3}, .offset = 0, .numel = 6});
  layout.tensors.push_back({.name = "b", .shape = {4}, .offset = 6, .numel = 4});
  layout.total_elements = kElements;
  return layout;
}

// Flat element i's values, exact in float and distinct across the three buffers.
float param_at(std::int64_t i) { return static_cast<float>(i) + 1.0f / 2; }
float exp_avg_at(std::int64_t i) { return -(static_cast<float>(i) + 1.0f / 4); }
float exp_avg_sq_at(std::int64_t i) { return static_cast<float>(i) + 1.0f / 8; }

// The known state's elements [begin, begin + count).
MainStateSlice<float> expected_slice(const FlatRange& range) {
  MainStateSlice<float> out{range.begin, {}, {}, {}};
  for (std::int64_t i = range.begin; i < range.begin + range.count; ++i) {
    out.params.push_back(param_at(i));
    out.exp_avg.push_back(exp_avg_at(i));
    out.exp_avg_sq.push_back(exp_avg_sq_at(i));
  }
  return out;
}

void expect_slice(const MainStateSlice<float>& got, const FlatRange& range, const std::string& what) {
  const MainStateSlice<float> want = expected_slice(range);
  EXPECT_EQ(got.begin, want.begin) << what;
  EXPECT_EQ(got.params, want.params) << what << ": main weights";
  EXPECT_EQ(got.exp_avg, want.exp_avg) << what << ": exp_avg";
  EXPECT_EQ(got.exp_avg_sq, want.exp_avg_sq) << what << ": exp_avg_sq";
}

// The distributed optimizer's per-bucket partition: [0, N) cut into buckets of `bucket` elements
// (the last may be shorter); each bucket cut into `ranks` slices of ceil(size / ranks); rank r owns
// slice r of every bucket (none where the bucket ends first). Element [r] is rank r's ranges.
std::vector<std::vector<FlatRange>> bucket_partition(int ranks, std::int64_t bucket) {
  std::vector<std::vector<FlatRange>> out(static_cast<std::size_t>(ranks));
  for (std::int64_t begin = 0; begin < kElements; begin += bucket) {
    const std::int64_t end = std::min(begin + bucket, kElements);
    const std::int64_t slice = (end - begin + ranks - 1) / ranks;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::int64_t first = begin + rank * slice;
      const std::int64_t last = std::min(first + slice, end);
      if (first < last) out[static_cast<std::size_t>(rank)].push_back({first, last - first});
    }
  }
  return out;
}

std::vector<Pieces> pieces_of(const std::vector<std::vector<FlatRange>>& partition) {
  std::vector<Pieces> out;
  for (const auto& ranges : partition) {
    Pieces pieces;
    for (const FlatRange& range : ranges) pieces.push_back(expected_slice(range));
    out.push_back(std::move(pieces));
  }
  return out;
}

json ranges_json(const std::vector<FlatRange>& ranges) {
  json out = json::array();
  for (const FlatRange& range : ranges) out.push_back(json::array({range.begin, range.count}));
  return out;
}

CheckpointState sharded_state(std::int64_t iteration, int ranks) {
  CheckpointState state;
  state.engine = "production";
  state.precision = std::string(kDtypeF32);
  state.run_config = json::object();
  state.parallel_layout = {{"data_parallel", ranks}};
  state.counters.iteration = iteration;
  state.counters.consumed_samples = 4 * iteration;
  state.counters.successful_updates = iteration;
  state.counters.scheduler_samples = 4 * iteration;
  state.data_position = json::object();
  state.random_streams = json::object();
  return state;
}

// save_sharded_checkpoint on one thread per rank, rank r saving pieces[r]; every rank's error
// message ("" where it returned).
std::vector<std::string> save_on_ranks(const fs::path& save_dir, std::int64_t iteration,
                                       const std::vector<Pieces>& pieces) {
  const int ranks = static_cast<int>(pieces.size());
  const auto group = production::make_thread_group(ranks);
  const ModelLayout layout = ten_element_layout();
  const CheckpointState state = sharded_state(iteration, ranks);
  std::vector<std::string> errors(pieces.size());
  production::run_thread_group(group, [&](int rank) {
    production::Collectives& collectives = *group[static_cast<std::size_t>(rank)];
    const RankExchange exchange{rank, ranks, [&collectives](const std::string& text) {
                                  return production::all_gather_strings(collectives, text);
                                }};
    try {
      save_sharded_checkpoint(save_dir, state, layout, pieces[static_cast<std::size_t>(rank)], exchange);
    } catch (const std::exception& error) {
      errors[static_cast<std::size_t>(rank)] = error.what();
    }
  });
  return errors;
}

// The partitions of the tests: DP size and bucket size; every rank holds 2 to 4 interleaved
// pieces, except rank 2 of {3, 4}, which owns nothing (buckets of 4 cut in slices of 2).
struct Partition {
  int ranks;
  std::int64_t bucket;
  std::string name() const { return std::to_string(ranks) + " ranks, buckets of " + std::to_string(bucket); }
};
const std::vector<Partition> kPartitions{{2, 4}, {3, 3}, {4, 4}, {3, 4}};

TEST(ShardedCheckpoint, TheBucketPartitionIsTheOneTheTestsMean) {
  // Buckets [0, 4), [4, 8), [8, 10), each cut in two: rank 0 the first half of each, rank 1 the second.
  EXPECT_EQ(bucket_partition(2, 4), (std::vector<std::vector<FlatRange>>{{{0, 2}, {4, 2}, {8, 1}},
                                                                         {{2, 2}, {6, 2}, {9, 1}}}));
  // Buckets of 4 in slices of 2 and the last, of 2, in slices of 1: rank 2 owns nothing.
  EXPECT_EQ(bucket_partition(3, 4), (std::vector<std::vector<FlatRange>>{{{0, 2}, {4, 2}, {8, 1}},
                                                                         {{2, 2}, {6, 2}, {9, 1}},
                                                                         {}}));
}

TEST(ShardedCheckpoint, EachRankWritesOneFileOfItsPiecesAndTheManifestRecordsTheirRanges) {
  for (const Partition& partition : kPartitions) {
    SCOPED_TRACE(partition.name());
    testing::ScratchDirectory scratch;
    const auto ranges = bucket_partition(partition.ranks, partition.bucket);
    for (const std::string& error : save_on_ranks(scratch.path(), 3, pieces_of(ranges))) ASSERT_EQ(error, "");

    const fs::path iter_dir = scratch.path() / "iter_0000003";
    EXPECT_EQ(testing::tensor_files_of(iter_dir).size(), static_cast<std::size_t>(partition.ranks));
    const json manifest = json::parse(testing::bytes_of(iter_dir / "manifest.json"));
    EXPECT_EQ(manifest.at("format_version"), kRangedShardedCheckpointFormatVersion);
    EXPECT_EQ(kRangedShardedCheckpointFormatVersion, 3);
    EXPECT_EQ(manifest.at("shards").at("ranks"), partition.ranks);
    const json& files = manifest.at("shards").at("files");
    ASSERT_EQ(files.size(), static_cast<std::size_t>(partition.ranks));
    for (int rank = 0; rank < partition.ranks; ++rank) {
      const auto r = static_cast<std::size_t>(rank);
      const std::string file = shard_file_name(rank, partition.ranks);
      EXPECT_EQ(files[r], (json{{"file", file}, {"rank", rank}, {"ranges", ranges_json(ranges[r])}}));

      // The file: the rank's pieces concatenated, in flat order, and its ranges in the metadata.
      const SafetensorsContents contents = read_safetensors(iter_dir / file);
      std::vector<float> params;
      std::vector<float> exp_avg;
      std::vector<float> exp_avg_sq;
      for (const FlatRange& range : ranges[r]) {
        const MainStateSlice<float> piece = expected_slice(range);
        params.insert(params.end(), piece.params.begin(), piece.params.end());
        exp_avg.insert(exp_avg.end(), piece.exp_avg.begin(), piece.exp_avg.end());
        exp_avg_sq.insert(exp_avg_sq.end(), piece.exp_avg_sq.begin(), piece.exp_avg_sq.end());
      }
      EXPECT_EQ(f32_values(find_tensor(contents.tensors, "main_weights", file)), params) << file;
      EXPECT_EQ(f32_values(find_tensor(contents.tensors, "exp_avg", file)), exp_avg) << file;
      EXPECT_EQ(f32_values(find_tensor(contents.tensors, "exp_avg_sq", file)), exp_avg_sq) << file;
      EXPECT_EQ(contents.metadata.at("flat_ranges"), ranges_json(ranges[r]).dump()) << file;
    }
  }
}

// Ranges unlike the written ones: unsorted, overlapping each other, across a tensor boundary and
// across several shards, empty, and the whole buffer.
const std::vector<std::vector<FlatRange>> kReadRangeSets{
    {{0, kElements}},
    {{3, 4}, {0, 1}, {9, 1}},
    {{2, 5}, {4, 3}},
    {{5, 2}},  // "a"'s last element and "b"'s first
    {{7, 0}, {1, 8}},
    {},
};

TEST(ShardedCheckpoint, AnyRangesAreReadBackFromThePiecesOfEveryPartition) {
  const ModelLayout layout = ten_element_layout();
  for (const Partition& partition : kPartitions) {
    testing::ScratchDirectory scratch;
    for (const std::string& error :
         save_on_ranks(scratch.path(), 3, pieces_of(bucket_partition(partition.ranks, partition.bucket)))) {
      ASSERT_EQ(error, "") << partition.name();
    }
    for (const auto& ranges : kReadRangeSets) {
      const std::string what = partition.name() + ", reading " + ranges_json(ranges).dump();
      const auto slices = read_main_state_pieces(scratch.path() / "iter_0000003", layout, ranges);
      ASSERT_EQ(slices.size(), ranges.size()) << what;
      for (std::size_t i = 0; i < ranges.size(); ++i) expect_slice(slices[i], ranges[i], what + " [" + std::to_string(i) + "]");
    }
    expect_slice(read_main_state_slice(scratch.path() / "iter_0000003", layout, 3, 5), {3, 5},
                 partition.name() + ": read_main_state_slice");
  }
}

TEST(ShardedCheckpoint, LoadCheckpointReassemblesTheWholeStateUnderTheTensorNames) {
  for (const Partition& partition : kPartitions) {
    SCOPED_TRACE(partition.name());
    testing::ScratchDirectory scratch;
    for (const std::string& error :
         save_on_ranks(scratch.path(), 3, pieces_of(bucket_partition(partition.ranks, partition.bucket)))) {
      ASSERT_EQ(error, "");
    }
    const CheckpointState loaded = load_checkpoint(scratch.path());
    EXPECT_EQ(loaded.counters, sharded_state(3, partition.ranks).counters);
    const MainStateSlice<float> a = expected_slice({0, 6});
    const MainStateSlice<float> b = expected_slice({6, 4});
    // In name order, as read_safetensors returns a one-dtype file.
    EXPECT_EQ(loaded.model_tensors, (std::vector<TensorData>{make_f32_tensor("a", {2, 3}, a.params),
                                                             make_f32_tensor("b", {4}, b.params)}));
    EXPECT_EQ(loaded.optimizer_tensors, (std::vector<TensorData>{make_f32_tensor("exp_avg.a", {2, 3}, a.exp_avg),
                                                                 make_f32_tensor("exp_avg.b", {4}, b.exp_avg),
                                                                 make_f32_tensor("exp_avg_sq.a", {2, 3}, a.exp_avg_sq),
                                                                 make_f32_tensor("exp_avg_sq.b", {4}, b.exp_avg_sq)}));
  }
}

// A range read touches only the files that hold its elements: with rank 1's file corrupted, ranges
// inside rank 0's pieces still read, and one element of rank 1's makes the read fail naming it.
TEST(ShardedCheckpoint, ARangeReadVerifiesOnlyTheFilesThatHoldIt) {
  testing::ScratchDirectory scratch;
  for (const std::string& error : save_on_ranks(scratch.path(), 3, pieces_of(bucket_partition(2, 4)))) {
    ASSERT_EQ(error, "");
  }
  const fs::path iter_dir = scratch.path() / "iter_0000003";
  const fs::path corrupted = iter_dir / shard_file_name(1, 2);
  {
    std::fstream file(corrupted, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.put('\x7f');
  }
  const ModelLayout layout = ten_element_layout();
  const std::vector<FlatRange> rank0_only{{0, 2}, {4, 2}, {8, 1}};
  const auto slices = read_main_state_pieces(iter_dir, layout, rank0_only);
  for (std::size_t i = 0; i < slices.size(); ++i) expect_slice(slices[i], rank0_only[i], "rank 0's ranges");
  try {
    read_main_state_pieces(iter_dir, layout, std::vector<FlatRange>{{0, 2}, {9, 1}});
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(corrupted.string()), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("CRC-32"), std::string::npos) << error.what();
  }
}

// Calls `read` and expects a std::runtime_error whose message holds every needle.
void expect_refusal(const std::function<void()>& read, const std::vector<std::string>& needles,
                    const std::string& what) {
  try {
    read();
    ADD_FAILURE() << what << ": no exception";
  } catch (const std::runtime_error& error) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << what << ": no \"" << needle << "\" in: " << error.what();
    }
  }
}

// A format 3 manifest whose ranges do not describe its files is refused, naming the manifest, the
// shard and field where there is one, and the rule; by the range read and by load_checkpoint.
TEST(ShardedCheckpoint, AManifestWhoseRangesDoNotTileTheBufferOrFitTheFilesIsRefused) {
  // 2 ranks, buckets of 4: rank 0 [[0, 2], [4, 2], [8, 1]], rank 1 [[2, 2], [6, 2], [9, 1]].
  const std::string rank0 = shard_file_name(0, 2);
  const std::string rank1 = shard_file_name(1, 2);
  struct Corruption {
    std::string name;
    std::function<void(json& files)> damage;
    std::vector<std::string> needles;
  };
  const std::vector<Corruption> corruptions{
      {"overlap", [](json& files) { files[1]["ranges"][0] = json::array({1, 3}); },
       {rank1 + " \"ranges\"[0] [1, 4) overlaps shard " + rank0 + " \"ranges\"[0] [0, 2)", "must tile"}},
      {"gap", [](json& files) { files[0]["ranges"][1] = json::array({4, 1}); },
       {"elements [5, 6) are in no range", "must tile the flat buffer [0, 10)"}},
      {"past the end", [](json& files) { files[1]["ranges"][2] = json::array({9, 2}); },
       {rank1 + " \"ranges\"[2] (begin 9, count 2) runs past the end of the flat buffer's 10 elements"}},
      {"negative begin", [](json& files) { files[0]["ranges"][0] = json::array({-1, 3}); },
       {rank0 + " \"ranges\"[0] (begin -1, count 3) begins before element 0"}},
      {"empty range", [](json& files) { files[1]["ranges"].push_back(json::array({10, 0})); },
       {rank1 + " \"ranges\"[3] (begin 10, count 0) is empty"}},
      {"out of order", [](json& files) { std::swap(files[0]["ranges"][0], files[0]["ranges"][1]); },
       {rank0 + " \"ranges\"[1] [0, 2) does not begin after shard " + rank0 + " \"ranges\"[0] [4, 6)", "increasing"}},
      {"not a pair", [](json& files) { files[0]["ranges"][2] = json::array({8}); },
       {"shard " + rank0 + ": \"ranges\"[2] holds [8], not a [begin, count] pair of integers"}},
      {"begin and count instead", [](json& files) { files[0].erase("ranges"); files[0]["begin"] = 0; files[0]["count"] = 5; },
       {"field \"ranges\" is missing"}},
      {"rank order", [](json& files) { std::swap(files[0], files[1]); },
       {"shard " + rank1 + " says rank 1 at position 0 of shards.files"}},
  };
  const ModelLayout layout = ten_element_layout();
  for (const Corruption& corruption : corruptions) {
    testing::ScratchDirectory scratch;
    for (const std::string& error : save_on_ranks(scratch.path(), 3, pieces_of(bucket_partition(2, 4)))) {
      ASSERT_EQ(error, "");
    }
    const fs::path iter_dir = scratch.path() / "iter_0000003";
    const fs::path manifest_path = iter_dir / "manifest.json";
    ASSERT_NO_THROW(load_checkpoint(scratch.path())) << corruption.name << ": the control";
    json manifest = json::parse(testing::bytes_of(manifest_path));
    corruption.damage(manifest["shards"]["files"]);
    manifest::seal(manifest);  // past the manifest's checksum, to the ranges' checks
    std::ofstream(manifest_path) << manifest.dump();
    std::vector<std::string> needles = corruption.needles;
    needles.push_back(manifest_path.string());
    expect_refusal([&] { read_main_state_pieces(iter_dir, layout, std::vector<FlatRange>{{0, kElements}}); }, needles,
                   corruption.name + ", range read");
    expect_refusal([&] { load_checkpoint(scratch.path()); }, needles, corruption.name + ", load_checkpoint");
  }
}

// Ranges that tile the buffer but not as the files hold it (a boundary moved from 2 to 3): rank
// 0's file holds 5 elements where its ranges say 6, and the read names the file and its ranges.
TEST(ShardedCheckpoint, AFileWhoseLengthDiffersFromItsRangesIsRefusedNamingIt) {
  testing::ScratchDirectory scratch;
  for (const std::string& error : save_on_ranks(scratch.path(), 3, pieces_of(bucket_partition(2, 4)))) {
    ASSERT_EQ(error, "");
  }
  const fs::path iter_dir = scratch.path() / "iter_0000003";
  const fs::path manifest_path = iter_dir / "manifest.json";
  json manifest = json::parse(testing::bytes_of(manifest_path));
  manifest["shards"]["files"][0]["ranges"][0] = json::array({0, 3});
  manifest["shards"]["files"][1]["ranges"][0] = json::array({3, 1});
  manifest::seal(manifest);
  std::ofstream(manifest_path) << manifest.dump();
  const std::vector<std::string> needles{(iter_dir / shard_file_name(0, 2)).string(),
                                         "tensor main_weights has shape [5]",
                                         "the manifest's \"ranges\" [[0,3],[4,2],[8,1]] for this file hold 6 elements"};
  expect_refusal([&] { read_main_state_pieces(iter_dir, ten_element_layout(), std::vector<FlatRange>{{0, 1}}); },
                 needles, "range read");
  expect_refusal([&] { load_checkpoint(scratch.path()); }, needles, "load_checkpoint");
}

// Rewrites a format 3 checkpoint whose ranks hold one range each (or none) as the format 2 writer
// wrote it: each shard's metadata flat_begin and flat_count instead of flat_ranges (its size and
// CRC-32 updated in the manifest), and shard entries {file, rank, begin, count}, an empty shard
// beginning where the state ends; and no manifest_crc32, which came after format 2.
void rewrite_as_format_2(const fs::path& iter_dir) {
  const fs::path manifest_path = iter_dir / "manifest.json";
  json manifest = json::parse(testing::bytes_of(manifest_path));
  manifest["format_version"] = kShardedCheckpointFormatVersion;
  for (json& entry : manifest["shards"]["files"]) {
    const std::string file = entry.at("file").get<std::string>();
    const json ranges = entry.at("ranges");
    ASSERT_LE(ranges.size(), 1u) << file << ": format 2 held one range per file";
    const std::int64_t begin = ranges.empty() ? kElements : ranges[0][0].get<std::int64_t>();
    const std::int64_t count = ranges.empty() ? 0 : ranges[0][1].get<std::int64_t>();
    SafetensorsContents contents = read_safetensors(iter_dir / file);
    contents.metadata.erase("flat_ranges");
    contents.metadata["flat_begin"] = std::to_string(begin);
    contents.metadata["flat_count"] = std::to_string(count);
    const FileDigest digest = write_safetensors(iter_dir / file, contents.tensors, contents.metadata);
    manifest["files"][file]["size_bytes"] = digest.size_bytes;
    manifest["files"][file]["crc32"] = crc32_hex(digest.crc32);
    const json rank = entry.at("rank");
    entry = {{"file", file}, {"rank", rank}, {"begin", begin}, {"count", count}};
  }
  manifest.erase(std::string(manifest::kManifestChecksumField));
  std::ofstream(manifest_path) << manifest.dump(2);
}

// Format 2 (one range per file, the distributed optimizer's contiguous shards) still reads: by any
// ranges, whole, and its manifest checks still refuse shards that do not continue each other.
TEST(ShardedCheckpoint, AFormat2CheckpointStillReads) {
  const ModelLayout layout = ten_element_layout();
  // Contiguous shards of 4: [0, 4), [4, 8), [8, 10), and rank 3 owns nothing.
  const std::vector<std::vector<FlatRange>> contiguous{{{0, 4}}, {{4, 4}}, {{8, 2}}, {}};
  testing::ScratchDirectory scratch;
  for (const std::string& error : save_on_ranks(scratch.path(), 5, pieces_of(contiguous))) ASSERT_EQ(error, "");
  const fs::path iter_dir = scratch.path() / "iter_0000005";
  rewrite_as_format_2(iter_dir);
  ASSERT_EQ(json::parse(testing::bytes_of(iter_dir / "manifest.json")).at("format_version"), 2);
  ASSERT_EQ(json::parse(testing::bytes_of(iter_dir / "manifest.json")).dump().find("ranges"), std::string::npos);

  for (const auto& ranges : kReadRangeSets) {
    const auto slices = read_main_state_pieces(iter_dir, layout, ranges);
    ASSERT_EQ(slices.size(), ranges.size());
    for (std::size_t i = 0; i < ranges.size(); ++i) expect_slice(slices[i], ranges[i], "format 2, " + ranges_json(ranges).dump());
  }
  const CheckpointState loaded = load_checkpoint(scratch.path());
  EXPECT_EQ(loaded.counters, sharded_state(5, 4).counters);
  EXPECT_EQ(find_tensor(loaded.model_tensors, "b", "format 2"), make_f32_tensor("b", {4}, expected_slice({6, 4}).params));

  const fs::path manifest_path = iter_dir / "manifest.json";
  json manifest = json::parse(testing::bytes_of(manifest_path));
  manifest["shards"]["files"][1]["begin"] = 5;
  std::ofstream(manifest_path) << manifest.dump();
  expect_refusal([&] { read_main_state_pieces(iter_dir, layout, std::vector<FlatRange>{{0, 1}}); },
                 {manifest_path.string(), "does not continue the shards before it at element 4"}, "format 2, moved begin");
}

// Format 1 (one process's whole files) is read by ranges too.
TEST(ShardedCheckpoint, AFormat1CheckpointIsReadByRanges) {
  const ModelLayout layout = ten_element_layout();
  CheckpointState state = sharded_state(2, 1);
  const MainStateSlice<float> a = expected_slice({0, 6});
  const MainStateSlice<float> b = expected_slice({6, 4});
  state.model_tensors = {make_f32_tensor("a", {2, 3}, a.params), make_f32_tensor("b", {4}, b.params)};
  state.optimizer_tensors = {make_f32_tensor("exp_avg.a", {2, 3}, a.exp_avg), make_f32_tensor("exp_avg.b", {4}, b.exp_avg),
                             make_f32_tensor("exp_avg_sq.a", {2, 3}, a.exp_avg_sq),
                             make_f32_tensor("exp_avg_sq.b", {4}, b.exp_avg_sq)};
  testing::ScratchDirectory scratch;
  const fs::path iter_dir = save_checkpoint(scratch.path(), state);
  for (const auto& ranges : kReadRangeSets) {
    const auto slices = read_main_state_pieces(iter_dir, layout, ranges);
    ASSERT_EQ(slices.size(), ranges.size());
    for (std::size_t i = 0; i < ranges.size(); ++i) expect_slice(slices[i], ranges[i], "format 1, " + ranges_json(ranges).dump());
  }
}

TEST(ShardedCheckpoint, ARangeOutsideTheBufferIsRefused) {
  testing::ScratchDirectory scratch;
  for (const std::string& error : save_on_ranks(scratch.path(), 3, pieces_of(bucket_partition(2, 4)))) {
    ASSERT_EQ(error, "");
  }
  for (const FlatRange& outside : {FlatRange{8, 3}, FlatRange{-1, 2}, FlatRange{2, -1}}) {
    try {
      read_main_state_pieces(scratch.path() / "iter_0000003", ten_element_layout(), std::vector<FlatRange>{{0, 1}, outside});
      ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("ranges[1] (begin " + std::to_string(outside.begin) + ", count " +
                                               std::to_string(outside.count) + ") is not inside the flat buffer [0, 10)"),
                std::string::npos)
          << error.what();
    }
  }
}

// Pieces that do not tile [0, N) fail the save on every rank, naming the rank and the range,
// before any file is written: nothing appears under the save directory.
TEST(ShardedCheckpoint, PiecesThatDoNotTileTheBufferFailEveryRankAndWriteNothing) {
  struct BadPartition {
    std::string name;
    std::vector<Pieces> pieces;
    std::vector<std::string> needles;
  };
  const auto good = bucket_partition(2, 4);  // rank 0 [[0, 2], [4, 2], [8, 1]], rank 1 [[2, 2], [6, 2], [9, 1]]
  auto with = [&](const std::function<void(std::vector<std::vector<FlatRange>>&)>& change) {
    auto ranges = good;
    change(ranges);
    return pieces_of(ranges);
  };
  auto mismatched = pieces_of(good);
  mismatched[1][2].exp_avg_sq.push_back(0.0f);
  const std::vector<BadPartition> cases{
      {"overlap", with([](auto& r) { r[1][1] = {5, 3}; }),
       {"rank 1's piece 1 [5, 8) overlaps rank 0's piece 1 [4, 6)", "must tile the flat buffer [0, 10) exactly"}},
      {"gap", with([](auto& r) { r[1].pop_back(); }), {"elements [9, 10) are in no range"}},
      {"past the end", with([](auto& r) { r[1][2] = {9, 2}; }),
       {"rank 1's piece 2 (begin 9, count 2) runs past the end of the flat buffer's 10 elements"}},
      {"out of order", with([](auto& r) { std::swap(r[0][0], r[0][2]); }),
       {"rank 0's piece 1 [4, 6) does not begin after rank 0's piece 0 [8, 9)"}},
      {"empty piece", with([](auto& r) { r[0].push_back({10, 0}); }),
       {"rank 0's piece 3 (begin 10, count 0) is empty"}},
      {"three parts of different sizes", mismatched,
       {"rank 1: piece 2 (begin 9) has 1 main weights, 1 exp_avg and 2 exp_avg_sq"}},
  };
  for (const BadPartition& bad : cases) {
    testing::ScratchDirectory scratch;
    const fs::path save_dir = scratch.path() / "save";
    const auto errors = save_on_ranks(save_dir, 3, bad.pieces);
    for (std::size_t rank = 0; rank < errors.size(); ++rank) {
      for (const std::string& needle : bad.needles) {
        EXPECT_NE(errors[rank].find(needle), std::string::npos)
            << bad.name << ": rank " << rank << ": no \"" << needle << "\" in: " << errors[rank];
      }
    }
    std::vector<std::string> left;
    if (fs::exists(save_dir)) {
      for (const auto& entry : fs::directory_iterator(save_dir)) left.push_back(entry.path().filename().string());
    }
    EXPECT_EQ(left, std::vector<std::string>{}) << bad.name;
  }
  // The control: the good partition saves.
  testing::ScratchDirectory scratch;
  for (const std::string& error : save_on_ranks(scratch.path(), 3, pieces_of(good))) EXPECT_EQ(error, "");
}

}  // namespace
}  // namespace tandem::checkpoint
