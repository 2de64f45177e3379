// Sharded checkpoints: the main state of a data-parallel production run, written by its ranks in
// parallel, each the flat ranges of the parameter buffer (core/model_layout.hpp) it holds, so that
// no rank ever holds the whole state:
//
//   SAVE/iter_0000042/shard_00000_of_00004.safetensors   rank 0's ranges, concatenated in flat
//   ...                                                  order: F32 1-D tensors "main_weights",
//   SAVE/iter_0000042/shard_00003_of_00004.safetensors   "exp_avg", "exp_avg_sq"
//   SAVE/iter_0000042/manifest.json                      the fields of format 1, "flat_layout"
//                                                        (each tensor's name, shape, offset) and
//                                                        "shards" (file, rank, ranges); written
//                                                        last, by rank 0
//
// format_version 3 records several ranges per file ("ranges": [[begin, count], ...]), as the
// distributed optimizer's per-bucket sharding needs (rank r owns the r-th slice of every gradient
// bucket); format_version 2, which this code no longer writes but still reads, recorded one
// ("begin", "count") per file.
//
// The save is collective and as atomic as format 1's: rank 0 creates the staging directory and
// tells the others its name; every rank learns every rank's ranges and checks that they tile the
// buffer; each rank writes and fsyncs its file there; every rank learns every outcome; only when
// all succeeded does rank 0 write the manifest, rename the directory into place and replace the
// tracker. A failure on any rank leaves the previous checkpoint untouched and makes every rank
// throw (no rank waits forever). Every rank must see the same SAVE directory (a shared
// filesystem), as with Megatron; a rank that does not see the staging directory says so.
//
// A resume reads only the shard files that overlap the ranges it needs, each once, verifying its
// size and CRC-32; the ranges may differ from the ones written (another data-parallel size or
// bucketing).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/manifest.hpp"
#include "core/model_layout.hpp"
#include "core/train/main_state.hpp"

namespace tandem::checkpoint {

// "shard_00001_of_00004.safetensors"
std::string shard_file_name(int rank, int ranks);

// How the ranks of a save talk: this rank, their number, and an all-gather of short strings
// (every rank calls it together and gets every rank's string in rank order).
struct RankExchange {
  int rank = 0;
  int size = 1;
  std::function<std::vector<std::string>(const std::string&)> all_gather;
};

// Collective: every rank calls it with the same `state` (counters, configuration; its tensor lists
// empty; precision F32) and its own `pieces` of the flat main state: non-empty, disjoint, in
// increasing flat order (a rank may have none). All ranks' pieces together must tile the flat
// buffer [0, layout.total_elements) exactly, in any interleaving of ranks. Each rank writes one
// file, its pieces concatenated. Returns the iteration directory. Throws std::runtime_error on
// every rank when any rank failed or the pieces do not tile the buffer, naming the rank and its
// reason or range. `hooks` (tests) sees "shard_..." on each rank, then "manifest.json",
// "directory" and "tracker" on rank 0.
std::filesystem::path save_sharded_checkpoint(const std::filesystem::path& save_dir,
                                              const CheckpointState& state, const ModelLayout& layout,
                                              std::span<const MainStateSlice<float>> pieces,
                                              const RankExchange& ranks, const SaveHooks& hooks = {});

// The F32 main state's flat elements of each of `ranges` (any ranges inside [0,
// layout.total_elements), in any order; empty ones too), one slice per range in the same order,
// from the checkpoint `directory` (an iter_ directory, as resolve_checkpoint_directory returns) of
// format 1, 2 or 3. Reads and verifies only the files that hold them, each once. Throws naming the
// file on corruption, naming the tensor when the checkpoint's layout is not `layout` (a different
// model), and std::invalid_argument for a range outside the buffer.
std::vector<MainStateSlice<float>> read_main_state_pieces(const std::filesystem::path& directory,
                                                          const ModelLayout& layout,
                                                          std::span<const FlatRange> ranges);

// read_main_state_pieces of the one range [begin, begin + count).
MainStateSlice<float> read_main_state_slice(const std::filesystem::path& directory, const ModelLayout& layout,
                                            std::int64_t begin, std::int64_t count);

// For load_checkpoint: verifies and reads every shard of a format_version 2 or 3 checkpoint and
// fills `read.state`'s tensor lists under format 1's names, as if the state had been written whole.
void read_sharded_tensors(const std::filesystem::path& directory, manifest::ReadManifest& read,
                          bool read_optimizer);

}  // namespace tandem::checkpoint
