// The safetensors format: layout, header text, strict validation (core/checkpoint/safetensors.hpp).
#include "core/checkpoint/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::size_t kLengthPrefixBytes = 8;
// The reference implementation refuses headers above 100 MB; so do we (a corrupt length would
// otherwise ask for an absurd allocation).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

[[noreturn]] void fail(std::string_view source, const std::string& problem) {
  throw std::runtime_error("safetensors file " + std::string(source) + ": " + problem);
}

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  const TensorData* tensor = nullptr;  // set when writing
};

// Validates what is about to be written and orders it as the reference writer does.
std::vector<Entry> lay_out(const std::vector<TensorData>& tensors) {
  std::vector<Entry> entries;
  std::set<std::string_view> names;
  for (const auto& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == kMetadataKey) {
      throw std::invalid_argument("cannot write a tensor named \"" + tensor.name +
                                  "\": names are non-empty and not __metadata__");
    }
    if (!names.insert(tensor.name).second) {
      throw std::invalid_argument("cannot write tensor " + tensor.name +
                                  " twice: names in one file are unique");
    }
    const auto expected = static_cast<std::uint64_t>(element_count(tensor.shape)) *
                          dtype_size(tensor.dtype);
    if (tensor.bytes.size() != expected) {
      throw std::invalid_argument("cannot write tensor " + tensor.name + ": " +
                                  std::to_string(tensor.bytes.size()) + " bytes, but its shape and " +
                                  tensor.dtype + " need " + std::to_string(expected));
    }
    entries.push_back({tensor.name, tensor.dtype, tensor.shape, 0, 0, &tensor});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    const auto size_a = dtype_size(a.dtype);
    const auto size_b = dtype_size(b.dtype);
    if (size_a != size_b) return size_a > size_b;
    return a.name < b.name;
  });
  std::uint64_t offset = 0;
  for (auto& entry : entries) {
    entry.begin = offset;
    offset += entry.tensor->bytes.size();
    entry.end = offset;
  }
  return entries;
}

// Compact JSON in the reference writer's key order, padded with spaces to a multiple of 8.
std::string header_text(const std::vector<Entry>& entries, const SafetensorsMetadata& metadata) {
  std::string text = "{";
  bool first = true;
  auto separator = [&] {
    if (!first) text += ',';
    first = false;
  };
  if (!metadata.empty()) {
    separator();
    text += json(kMetadataKey).dump() + ":" + json(metadata).dump();
  }
  for (const auto& entry : entries) {
    separator();
    text += json(entry.name).dump() + ":{\"dtype\":" + json(entry.dtype).dump() +
            ",\"shape\":" + json(entry.shape).dump() + ",\"data_offsets\":[" +
            std::to_string(entry.begin) + "," + std::to_string(entry.end) + "]}";
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::array<std::byte, kLengthPrefixBytes> length_prefix(std::uint64_t length) {
  std::array<std::byte, kLengthPrefixBytes> bytes{};
  for (std::size_t i = 0; i < kLengthPrefixBytes; ++i) {
    bytes[i] = static_cast<std::byte>((length >> (8 * i)) & 0xFF);
  }
  return bytes;
}

std::uint64_t read_length_prefix(std::span<const std::byte> bytes) {
  std::uint64_t length = 0;
  for (std::size_t i = 0; i < kLengthPrefixBytes; ++i) {
    length |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  }
  return length;
}

std::uint64_t checked_header_length(std::uint64_t header_length, std::uint64_t file_size,
                                    std::string_view source) {
  if (header_length > kMaxHeaderBytes) {
    fail(source, "header length " + std::to_string(header_length) + " exceeds the " +
                     std::to_string(kMaxHeaderBytes) + "-byte limit; the file is corrupt");
  }
  if (header_length > file_size - kLengthPrefixBytes) {
    fail(source, "header length " + std::to_string(header_length) +
                     " runs past the end of the file (" + std::to_string(file_size) +
                     " bytes in all); the file is truncated or corrupt");
  }
  return header_length;
}

std::uint64_t json_offset(const json& value, std::string_view source, const std::string& name) {
  if (!value.is_number_unsigned()) {
    fail(source, "tensor " + name + ": data_offsets hold " + value.dump() +
                     ", not non-negative integers");
  }
  return value.get<std::uint64_t>();
}

// Parses and checks the header against a data section of `data_size` bytes. Returns the entries
// in data order and the metadata.
std::vector<Entry> parse_header(std::string_view header, std::uint64_t data_size,
                                std::string_view source, SafetensorsMetadata& metadata) {
  if (header.empty() || header.front() != '{') {
    fail(source, "header does not start with '{'; not a safetensors file");
  }
  std::set<std::string> keys;
  std::string duplicate;
  const json::parser_callback_t note_duplicates = [&](int depth, json::parse_event_t event,
                                                      json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(header.begin(), header.end(), note_duplicates);
  } catch (const json::exception& error) {
    fail(source, std::string("header is not valid JSON: ") + error.what());
  }
  if (!parsed.is_object()) fail(source, "header is JSON but not an object");
  if (!duplicate.empty()) fail(source, "header names \"" + duplicate + "\" twice");

  std::vector<Entry> entries;
  for (const auto& [name, value] : parsed.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail(source, "__metadata__ is not an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          fail(source, "__metadata__ key \"" + key + "\" holds " + text.dump() +
                           "; the format allows only string values");
        }
        metadata[key] = text.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || value.size() != 3 || !value.contains("dtype") ||
        !value.contains("shape") || !value.contains("data_offsets")) {
      fail(source, "tensor " + name + ": entry " + value.dump() +
                       " is not {\"dtype\", \"shape\", \"data_offsets\"}");
    }
    Entry entry;
    entry.name = name;
    const json& dtype = value["dtype"];
    if (!dtype.is_string()) fail(source, "tensor " + name + ": dtype " + dtype.dump() + " is not a string");
    entry.dtype = dtype.get<std::string>();
    if (!is_supported_dtype(entry.dtype)) {
      fail(source, "tensor " + name + ": dtype \"" + entry.dtype +
                       "\" is unknown to tandem; it reads F32, F64 and BF16");
    }
    const json& shape = value["shape"];
    if (!shape.is_array()) fail(source, "tensor " + name + ": shape " + shape.dump() + " is not an array");
    for (const json& dimension : shape) {
      if (!dimension.is_number_unsigned() ||
          dimension.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(source, "tensor " + name + ": shape " + shape.dump() +
                         " holds something other than non-negative integers");
      }
      entry.shape.push_back(dimension.get<std::int64_t>());
    }
    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      fail(source, "tensor " + name + ": data_offsets " + offsets.dump() + " is not [begin, end]");
    }
    entry.begin = json_offset(offsets[0], source, name);
    entry.end = json_offset(offsets[1], source, name);
    if (entry.end < entry.begin) {
      fail(source, "tensor " + name + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                       std::to_string(entry.end) + "] end before they begin");
    }
    if (entry.end > data_size) {
      fail(source, "tensor " + name + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                       std::to_string(entry.end) + "] run past the end of the data (" +
                       std::to_string(data_size) + " bytes); the file is truncated or corrupt");
    }
    std::int64_t count = 0;
    try {
      count = element_count(entry.shape);
    } catch (const std::exception& error) {
      fail(source, "tensor " + name + ": " + error.what());
    }
    const std::uint64_t element_bytes = dtype_size(entry.dtype);
    if (static_cast<std::uint64_t>(count) > std::numeric_limits<std::uint64_t>::max() / element_bytes ||
        entry.end - entry.begin != static_cast<std::uint64_t>(count) * element_bytes) {
      fail(source, "tensor " + name + ": data_offsets span " + std::to_string(entry.end - entry.begin) +
                       " bytes, but shape " + shape.dump() + " of " + entry.dtype + " needs " +
                       std::to_string(static_cast<std::uint64_t>(count) * element_bytes));
    }
    entries.push_back(std::move(entry));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& entry = entries[i];
    if (entry.begin < covered) {
      fail(source, "tensor " + entry.name + " at bytes [" + std::to_string(entry.begin) + ", " +
                       std::to_string(entry.end) + ") overlaps tensor " + entries[i - 1].name +
                       " ending at byte " + std::to_string(covered));
    }
    if (entry.begin > covered) {
      fail(source, "data bytes [" + std::to_string(covered) + ", " + std::to_string(entry.begin) +
                       ") belong to no tensor (before tensor " + entry.name + ")");
    }
    covered = entry.end;
  }
  if (covered != data_size) {
    fail(source, "data bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) +
                     ") after the last tensor belong to no tensor");
  }
  return entries;
}

}  // namespace

std::vector<std::byte> encode_safetensors(const std::vector<TensorData>& tensors,
                                          const SafetensorsMetadata& metadata) {
  const auto entries = lay_out(tensors);
  const std::string header = header_text(entries, metadata);
  const auto prefix = length_prefix(header.size());
  // Sized once and filled in place: growing the vector by insert made GCC 12's -O3 report a
  // false -Wstringop-overflow (the Release build failed under -Werror).
  std::size_t total = prefix.size() + header.size();
  for (const auto& entry : entries) total += entry.tensor->bytes.size();
  std::vector<std::byte> bytes(total);
  auto next = std::copy(prefix.begin(), prefix.end(), bytes.begin());
  const auto* header_bytes = reinterpret_cast<const std::byte*>(header.data());
  next = std::copy(header_bytes, header_bytes + header.size(), next);
  for (const auto& entry : entries) next = std::copy(entry.tensor->bytes.begin(), entry.tensor->bytes.end(), next);
  return bytes;
}

SafetensorsContents decode_safetensors(std::span<const std::byte> file_bytes,
                                       std::string_view source) {
  if (file_bytes.size() < kLengthPrefixBytes) {
    fail(source, "truncated: " + std::to_string(file_bytes.size()) +
                     " bytes, shorter than the 8-byte header length");
  }
  const std::uint64_t header_length =
      checked_header_length(read_length_prefix(file_bytes), file_bytes.size(), source);
  const std::string_view header(reinterpret_cast<const char*>(file_bytes.data()) + kLengthPrefixBytes,
                                header_length);
  const std::size_t data_start = kLengthPrefixBytes + header_length;
  SafetensorsContents contents;
  const auto entries = parse_header(header, file_bytes.size() - data_start, source, contents.metadata);
  for (const auto& entry : entries) {
    TensorData tensor{entry.name, entry.dtype, entry.shape, {}};
    tensor.bytes.assign(file_bytes.begin() + static_cast<std::ptrdiff_t>(data_start + entry.begin),
                        file_bytes.begin() + static_cast<std::ptrdiff_t>(data_start + entry.end));
    contents.tensors.push_back(std::move(tensor));
  }
  return contents;
}

FileDigest write_safetensors(const fs::path& path, const std::vector<TensorData>& tensors,
                             const SafetensorsMetadata& metadata) {
  const auto entries = lay_out(tensors);
  const std::string header = header_text(entries, metadata);
  FileWriter writer(path);
  const auto prefix = length_prefix(header.size());
  writer.write(prefix.data(), prefix.size());
  writer.write(header);
  for (const auto& entry : entries) writer.write(entry.tensor->bytes.data(), entry.tensor->bytes.size());
  return writer.close();
}

FileDigest write_safetensors_atomically(const fs::path& path, const std::vector<TensorData>& tensors,
                                        const SafetensorsMetadata& metadata) {
  const auto bytes = encode_safetensors(tensors, metadata);
  return write_file_atomically(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

SafetensorsContents read_safetensors(const fs::path& path) {
  const std::string source = path.string();
  std::error_code size_error;
  const std::uint64_t file_size = fs::file_size(path, size_error);
  if (size_error) fail(source, "cannot read: " + size_error.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(source, "cannot open for reading");
  if (file_size < kLengthPrefixBytes) {
    fail(source, "truncated: " + std::to_string(file_size) +
                     " bytes, shorter than the 8-byte header length");
  }
  std::array<std::byte, kLengthPrefixBytes> prefix{};
  auto read_exactly = [&](void* into, std::uint64_t size, const std::string& what) {
    in.read(static_cast<char*>(into), static_cast<std::streamsize>(size));
    if (static_cast<std::uint64_t>(in.gcount()) != size) {
      fail(source, "truncated while reading " + what + " (the file changed or is unreadable)");
    }
  };
  read_exactly(prefix.data(), prefix.size(), "the header length");
  const std::uint64_t header_length = checked_header_length(read_length_prefix(prefix), file_size, source);
  std::string header(header_length, '\0');
  read_exactly(header.data(), header_length, "the header");
  SafetensorsContents contents;
  const auto entries = parse_header(header, file_size - kLengthPrefixBytes - header_length, source,
                                    contents.metadata);
  // Offsets are contiguous from 0 (checked), so reading in offset order is one sequential pass.
  for (const auto& entry : entries) {
    TensorData tensor{entry.name, entry.dtype, entry.shape, {}};
    tensor.bytes.resize(entry.end - entry.begin);
    read_exactly(tensor.bytes.data(), tensor.bytes.size(), "tensor " + entry.name);
    contents.tensors.push_back(std::move(tensor));
  }
  return contents;
}

}  // namespace tandem::checkpoint
