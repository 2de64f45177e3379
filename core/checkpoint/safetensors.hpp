// Reader and writer of the safetensors format (SPEC 9 checkpoint files, SPEC 12 exports).
//
// Layout: an unsigned 64-bit little-endian length N; N bytes of UTF-8 JSON header
//   {"__metadata__": {"key": "value", ...},
//    "NAME": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8 bytes; then the data, where [begin, end) are byte offsets
// from the first byte after the header. The writer lays tensors out as the reference library does
// (largest dtype first, then by name; one dtype means plain name order), writes the header in that
// order with compact JSON, `__metadata__` first, and covers the data with no gap.
//
// The reader is strict: a file that is truncated, whose header length runs past its end, whose
// header is not a JSON object of well-formed entries, whose offsets overlap, leave gaps or run
// past the end, whose byte ranges disagree with dtype x shape, or that uses a dtype other than
// F32/F64/BF16 is refused with an error naming the file and the problem.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/tensor_data.hpp"

namespace tandem::checkpoint {

// The header's "__metadata__": string keys to string values (the format allows nothing else).
using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  std::vector<TensorData> tensors;  // in file (data offset) order
  SafetensorsMetadata metadata;
};

// The whole file as bytes (for tests and small files).
std::vector<std::byte> encode_safetensors(const std::vector<TensorData>& tensors,
                                          const SafetensorsMetadata& metadata = {});

// Parses bytes held in memory; `source` names them in errors (a path or "buffer").
SafetensorsContents decode_safetensors(std::span<const std::byte> file_bytes,
                                       std::string_view source);

// Writes the file at `path` (created or truncated, fsynced, not renamed: call it inside a
// StagedDirectory, or use write_safetensors_atomically). Returns its size and CRC-32.
FileDigest write_safetensors(const std::filesystem::path& path,
                             const std::vector<TensorData>& tensors,
                             const SafetensorsMetadata& metadata = {});

// write_safetensors through a temporary file and a rename (atomic_file.hpp).
FileDigest write_safetensors_atomically(const std::filesystem::path& path,
                                        const std::vector<TensorData>& tensors,
                                        const SafetensorsMetadata& metadata = {});

// Reads and validates the file at `path`, reading each tensor straight into its own buffer.
SafetensorsContents read_safetensors(const std::filesystem::path& path);

}  // namespace tandem::checkpoint
