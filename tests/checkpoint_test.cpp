// The checkpoint format (SPEC 9) and `tandem export` (SPEC 12): safetensors written byte for byte
// as the format specifies and read back exactly; every malformed or corrupted input refused with
// an error naming its file; saves that appear complete or not at all; bit-exact save/load; the
// resume-settings check; and the Hugging Face export through the real binary.
//
// Every comparison here is exact: files are compared byte for byte, values bit for bit, and
// conversions against their round-to-nearest-even derivation.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/args.hpp"
#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/hf_export.hpp"
#include "core/checkpoint/manifest.hpp"
#include "core/checkpoint/resume_check.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/config.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Helpers

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem-checkpoint-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::vector<std::byte> as_bytes(std::string_view text) {
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

void append(std::vector<std::byte>& to, std::initializer_list<unsigned> values) {
  for (unsigned value : values) to.push_back(static_cast<std::byte>(value));
}

// A safetensors file assembled from raw parts: 8-byte LE header length, header, data.
std::vector<std::byte> raw_safetensors(std::string_view header, std::size_t data_bytes,
                                       std::uint64_t header_length_field) {
  std::vector<std::byte> bytes;
  for (int i = 0; i < 8; ++i) {
    bytes.push_back(static_cast<std::byte>((header_length_field >> (8 * i)) & 0xFF));
  }
  const auto header_bytes = as_bytes(header);
  bytes.insert(bytes.end(), header_bytes.begin(), header_bytes.end());
  bytes.resize(bytes.size() + data_bytes, std::byte{0});
  return bytes;
}

std::vector<std::byte> raw_safetensors(std::string_view header, std::size_t data_bytes) {
  return raw_safetensors(header, data_bytes, header.size());
}

// Runs `what()` expecting an exception whose message contains every needle.
template <typename Body>
void expect_error(Body&& what, const std::vector<std::string>& needles) {
  try {
    what();
  } catch (const std::exception& error) {
    const std::string message = error.what();
    for (const auto& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << "error message lacks \"" << needle << "\": " << message;
    }
    return;
  }
  ADD_FAILURE() << "no error was raised; expected one mentioning " << needles.front();
}

std::vector<TensorData> sorted_by_name(std::vector<TensorData> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorData& a, const TensorData& b) { return a.name < b.name; });
  return tensors;
}

// The command with its stderr, through /bin/sh (stdout and stderr together).
testing::CommandResult run_command(const std::string& command) {
  return testing::run_shell(command + " 2>&1");
}

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

// A value for element i of tensor t that is exact in every precision involved: a dyadic fraction
// with at most 8 significant bits, so F64 -> F32 -> BF16 are all exact unless a test wants
// otherwise.
double dyadic_value(std::size_t tensor_index, std::size_t element) {
  const auto numerator = static_cast<double>(static_cast<int>((element * 37 + tensor_index * 11) % 255) - 127);
  return numerator / 256.0;  // in [-127/256, 127/256]
}

// ---------------------------------------------------------------------------------------------
// Safetensors: the format, byte for byte

TEST(Safetensors, WritesTheHandBuiltBytesOfTheFormatSpecification) {
  // One F32 tensor "attn0" of shape [1, 1, 2, 3] holding 0..5. The header is compact JSON with
  // keys dtype, shape, data_offsets in that order; 65 characters, padded with 7 spaces to 72.
  const std::string header_json =
      R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header_json.size(), 65u);
  std::vector<std::byte> expected;
  append(expected, {72, 0, 0, 0, 0, 0, 0, 0});
  const auto header_bytes = as_bytes(header_json + std::string(7, ' '));
  expected.insert(expected.end(), header_bytes.begin(), header_bytes.end());
  // IEEE-754 binary32, little-endian: 0.0, 1.0 = 0x3F800000, 2.0 = 0x40000000,
  // 3.0 = 0x40400000, 4.0 = 0x40800000, 5.0 = 0x40A00000.
  append(expected, {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40,
                    0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xA0, 0x40});

  const std::vector<float> values{0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  const std::vector<TensorData> tensors{make_f32_tensor("attn0", {1, 1, 2, 3}, values)};
  EXPECT_EQ(encode_safetensors(tensors), expected);

  TempDir dir;
  const FileDigest digest = write_safetensors(dir.path() / "one.safetensors", tensors);
  EXPECT_EQ(read_bytes(dir.path() / "one.safetensors"), expected);
  EXPECT_EQ(digest.size_bytes, expected.size());
  EXPECT_EQ(digest.crc32, digest_file(dir.path() / "one.safetensors").crc32);

  const auto decoded = decode_safetensors(expected, "hand-built");
  ASSERT_EQ(decoded.tensors.size(), 1u);
  EXPECT_EQ(decoded.tensors[0], tensors[0]);
  EXPECT_EQ(f32_values(decoded.tensors[0]), values);
}

TEST(Safetensors, WritesMetadataFirstAndAnEmptyFileAsTheFormatDoes) {
  // No tensors: "{}" padded with 6 spaces to 8.
  std::vector<std::byte> empty;
  append(empty, {8, 0, 0, 0, 0, 0, 0, 0});
  const auto empty_header = as_bytes("{}      ");
  empty.insert(empty.end(), empty_header.begin(), empty_header.end());
  EXPECT_EQ(encode_safetensors({}), empty);

  // Metadata comes first; 35 characters padded with 5 spaces to 40.
  const std::string header = R"({"__metadata__":{"framework":"pt"}})";
  ASSERT_EQ(header.size(), 35u);
  const auto bytes = encode_safetensors({}, {{"framework", "pt"}});
  EXPECT_EQ(bytes, raw_safetensors(header + "     ", 0));
  EXPECT_EQ(bytes.size(), 8u + 40u);
  EXPECT_EQ(decode_safetensors(bytes, "buffer").metadata, (SafetensorsMetadata{{"framework", "pt"}}));
  // With a tensor: metadata, then the tensor entry.
  const std::vector<float> one{1.0f};
  const std::string with_tensor =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ASSERT_EQ(with_tensor.size(), 85u);  // padded with 3 spaces to 88
  auto expected = raw_safetensors(with_tensor + "   ", 0);
  append(expected, {0x00, 0x00, 0x80, 0x3F});  // 1.0f
  EXPECT_EQ(encode_safetensors({make_f32_tensor("w", {1}, one)}, {{"format", "pt"}}), expected);
}

TEST(Safetensors, LaysOutLargestDtypeFirstThenByNameAndRoundTripsEveryDtype) {
  const std::vector<double> f64{-0.0, std::numeric_limits<double>::denorm_min(),
                                std::numeric_limits<double>::infinity(), 1.0 / 3.0};
  const std::vector<float> f32{std::numeric_limits<float>::quiet_NaN(), -1.5f, 0x1p-149f};
  const std::vector<std::uint16_t> bf16{0x3F80, 0xFF80, 0x0001, 0x7FC1};
  const std::vector<TensorData> tensors{
      make_bf16_tensor("a.bf16", {2, 2}, bf16),
      make_f32_tensor("z.f32", {3}, f32),
      make_f32_tensor("b.f32", {3, 1}, f32),
      make_f64_tensor("y.f64", {4}, f64),
      make_f64_tensor("scalar", {}, std::vector<double>{2.5}),
      make_f32_tensor("empty", {0, 4}, std::vector<float>{}),
  };
  const auto bytes = encode_safetensors(tensors, {{"engine", "reference"}});
  const auto decoded = decode_safetensors(bytes, "buffer");

  std::vector<std::string> order;
  for (const auto& tensor : decoded.tensors) order.push_back(tensor.name);
  EXPECT_EQ(order, (std::vector<std::string>{"scalar", "y.f64", "b.f32", "empty", "z.f32", "a.bf16"}));
  EXPECT_EQ(sorted_by_name(decoded.tensors), sorted_by_name(tensors));  // bytes compared exactly
  EXPECT_EQ(decoded.metadata.at("engine"), "reference");
  EXPECT_EQ(bf16_bits(find_tensor(decoded.tensors, "a.bf16", "test")), bf16);
  const auto y = f64_values(find_tensor(decoded.tensors, "y.f64", "test"));
  EXPECT_TRUE(std::signbit(y[0]));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(y[1]), 1u);

  TempDir dir;
  write_safetensors_atomically(dir.path() / "mixed.safetensors", tensors);
  EXPECT_EQ(read_bytes(dir.path() / "mixed.safetensors"), encode_safetensors(tensors));
  EXPECT_EQ(sorted_by_name(read_safetensors(dir.path() / "mixed.safetensors").tensors),
            sorted_by_name(tensors));
}

TEST(Safetensors, TypedReadBackRefusesAnotherDtype) {
  const auto tensor = make_f64_tensor("w", {2}, std::vector<double>{1.0, 2.0});
  expect_error([&] { f32_values(tensor); }, {"tensor w", "F64", "not F32"});
  expect_error([&] { make_f32_tensor("w", {3}, std::vector<float>{1.0f}); }, {"tensor w", "1 values"});
}

TEST(Safetensors, WriterRefusesInconsistentTensors) {
  auto wrong_size = make_f32_tensor("w", {2}, std::vector<float>{1.0f, 2.0f});
  wrong_size.bytes.pop_back();
  expect_error([&] { encode_safetensors({wrong_size}); }, {"tensor w", "7 bytes", "need 8"});
  const auto tensor = make_f32_tensor("w", {1}, std::vector<float>{1.0f});
  expect_error([&] { encode_safetensors({tensor, tensor}); }, {"tensor w twice"});
  auto unknown = tensor;
  unknown.dtype = "F16";
  expect_error([&] { encode_safetensors({unknown}); }, {"F16"});
}

// Every malformed file is refused with an error naming the file and the problem.
struct BadFile {
  const char* name;
  std::vector<std::byte> bytes;
  std::vector<std::string> needles;
};

TEST(Safetensors, RefusesEveryMalformedFileNamingFileAndProblem) {
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto good = raw_safetensors(good_header, 8);
  ASSERT_NO_THROW(decode_safetensors(good, "control"));  // the negative control: this one is fine

  auto cut_data = good;
  cut_data.resize(cut_data.size() - 3);
  std::vector<BadFile> cases{
      {"shorter-than-length", std::vector<std::byte>(5, std::byte{0}), {"truncated", "5 bytes"}},
      {"header-past-end", raw_safetensors(good_header, 8, 4096), {"header length 4096", "past the end"}},
      {"huge-header", raw_safetensors(good_header, 8, std::uint64_t{1} << 40), {"exceeds"}},
      {"truncated-data", cut_data, {"tensor w", "past the end of the data (5 bytes)"}},
      {"not-json", raw_safetensors(R"({"w": nonsense})", 0), {"not valid JSON"}},
      {"not-an-object", raw_safetensors(R"([1, 2])", 0), {"does not start with '{'"}},
      {"overlapping",
       raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       {"tensor b", "overlaps tensor a"}},
      {"gap",
       raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       {"bytes [0, 4)", "belong to no tensor"}},
      {"trailing-bytes", raw_safetensors(good_header, 12), {"bytes [8, 12)", "belong to no tensor"}},
      {"offsets-past-end",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
       {"tensor w", "past the end of the data"}},
      {"wrong-dtype-size",
       raw_safetensors(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", 8),
       {"tensor w", "span 8 bytes", "needs 16"}},
      {"unknown-dtype",
       raw_safetensors(R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", 8),
       {"tensor w", "\"F16\"", "unknown"}},
      {"reversed-offsets",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       {"end before they begin"}},
      {"negative-shape",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       {"tensor w", "non-negative"}},
      {"missing-field", raw_safetensors(R"({"w":{"dtype":"F32","shape":[2]}})", 8), {"tensor w"}},
      {"duplicate-name",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       {"\"w\" twice"}},
      {"metadata-not-strings", raw_safetensors(R"({"__metadata__":{"step":3}})", 0),
       {"__metadata__", "string values"}},
  };
  TempDir dir;
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    const fs::path path = dir.path() / (std::string(bad.name) + ".safetensors");
    write_bytes(path, bad.bytes);
    auto needles = bad.needles;
    needles.push_back(path.string());
    expect_error([&] { read_safetensors(path); }, needles);
    expect_error([&] { decode_safetensors(bad.bytes, bad.name); }, bad.needles);
  }
  expect_error([&] { read_safetensors(dir.path() / "absent.safetensors"); },
               {(dir.path() / "absent.safetensors").string()});
}

// ---------------------------------------------------------------------------------------------
// Round to nearest even, straight from the stored precision

TEST(Bf16, RoundsToNearestEvenFromDoubleWithoutDoubleRounding) {
  EXPECT_EQ(bf16_from_double(1.0), 0x3F80);
  EXPECT_EQ(bf16_from_double(-2.0), 0xC000);
  EXPECT_EQ(bf16_from_double(1.0 + 0x1p-7), 0x3F81);  // exactly representable
  // Ties go to the even neighbour: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7.
  EXPECT_EQ(bf16_from_double(1.0 + 0x1p-8), 0x3F80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(bf16_from_double(1.0 + 3 * 0x1p-8), 0x3F82);
  // Just above a tie: the direct rounding goes up. Rounding through float first would land on
  // the tie and go down to even: the double rounding a direct conversion avoids.
  const double above_tie = 1.0 + 0x1p-8 + 0x1p-40;
  EXPECT_EQ(bf16_from_double(above_tie), 0x3F81);
  EXPECT_EQ(bf16_from_float(static_cast<float>(above_tie)), 0x3F80);  // the control: it differs
  // Signs, zeros, infinities, NaN.
  EXPECT_EQ(bf16_from_double(-0.0), 0x8000);
  EXPECT_EQ(bf16_from_double(std::numeric_limits<double>::infinity()), 0x7F80);
  EXPECT_EQ(bf16_from_double(-std::numeric_limits<double>::infinity()), 0xFF80);
  EXPECT_EQ(bf16_from_double(std::numeric_limits<double>::quiet_NaN()) & 0x7FFF, 0x7FC0);
  // Overflow: the largest finite bf16 is (2 - 2^-7) * 2^127 (0x7F7F); halfway to 2^128 rounds
  // to even, which is 2^128 = Inf; FLT_MAX is past the halfway point.
  EXPECT_EQ(bf16_from_double((2.0 - 0x1p-7) * 0x1p127), 0x7F7F);
  EXPECT_EQ(bf16_from_double((2.0 - 0x1p-8) * 0x1p127), 0x7F80);
  EXPECT_EQ(bf16_from_double(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(bf16_from_double(1e300), 0x7F80);
  // Subnormals step by 2^-133: 2^-134 is a tie between 0 (even) and 2^-133; 3 * 2^-134 is a tie
  // between 2^-133 (odd) and 2 * 2^-133 (even).
  EXPECT_EQ(bf16_from_double(0x1p-133), 0x0001);
  EXPECT_EQ(bf16_from_double(0x1p-134), 0x0000);
  EXPECT_EQ(bf16_from_double(3 * 0x1p-134), 0x0002);
  EXPECT_EQ(bf16_from_double(-1e-300), 0x8000);
  // The smallest bf16 normal, 2^-126.
  EXPECT_EQ(bf16_from_double(0x1p-126), 0x0080);
}

TEST(Bf16, AgreesWithTheIntegerRoundingOfFloatBitsAcrossTheFloatRange) {
  // For float inputs, round to nearest even on the bit pattern is the classic integer formula;
  // the two derivations must agree on every input sampled (a prime stride over all 2^32).
  std::uint64_t checked = 0;
  for (std::uint64_t pattern = 0; pattern < (std::uint64_t{1} << 32); pattern += 7919) {
    const auto bits = static_cast<std::uint32_t>(pattern);
    const float value = std::bit_cast<float>(bits);
    if (std::isnan(value)) continue;
    const auto expected = static_cast<std::uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
    ASSERT_EQ(bf16_from_float(value), expected) << "float bits 0x" << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 500'000u);
}

TEST(Bf16, ConvertTensorRoundsEachElementFromItsStoredPrecision) {
  const std::vector<double> values{1.0 + 0x1p-8 + 0x1p-40, 1.0 / 3.0, -0.0, 0x1p-150};
  const auto f64 = make_f64_tensor("w", {2, 2}, values);
  const auto f32 = convert_tensor(f64, "F32");
  const auto bf16 = convert_tensor(f64, "BF16");
  EXPECT_EQ(f32.shape, f64.shape);
  const auto narrowed = f32_values(f32);
  const auto rounded = bf16_bits(bf16);
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(narrowed[i]),
              std::bit_cast<std::uint32_t>(static_cast<float>(values[i])));
    EXPECT_EQ(rounded[i], bf16_from_double(values[i]));
  }
  EXPECT_EQ(rounded[0], 0x3F81);  // not 0x3F80: no detour through float
  EXPECT_EQ(values_as_f64(convert_tensor(bf16, "F64")), values_as_f64(bf16));  // widening is exact
  expect_error([&] { convert_tensor(f64, "F16"); }, {"F16"});
}

// ---------------------------------------------------------------------------------------------
// Atomic files and directories

bool has_staging_leftovers(const fs::path& directory) {
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) return true;
  }
  return false;
}

TEST(AtomicFile, ReplacesAFileWholeAndLeavesNoTemporary) {
  TempDir dir;
  const fs::path path = dir.path() / "tracker.txt";
  write_file_atomically(path, "41");
  const FileDigest digest = write_file_atomically(path, "42");
  EXPECT_EQ(read_text(path), "42");
  EXPECT_EQ(digest.size_bytes, 2u);
  EXPECT_FALSE(has_staging_leftovers(dir.path()));
  // CRC-32 of "123456789" is the standard check value 0xCBF43926.
  write_file_atomically(dir.path() / "check", "123456789");
  EXPECT_EQ(crc32_hex(digest_file(dir.path() / "check").crc32), "cbf43926");
  expect_error([&] { write_file_atomically(dir.path() / "no-such-dir" / "f", "x"); },
               {(dir.path() / "no-such-dir" / "f").string()});
}

TEST(AtomicFile, StagedDirectoryAppearsWholeOrNotAtAll) {
  TempDir dir;
  const fs::path final_path = dir.path() / "out";
  {
    StagedDirectory staged(final_path);
    write_text(staged.staging_path() / "a", "partial");
    // Destroyed without commit: an interrupted write.
  }
  EXPECT_FALSE(fs::exists(final_path));
  EXPECT_FALSE(has_staging_leftovers(dir.path()));
  {
    StagedDirectory staged(final_path);
    write_text(staged.staging_path() / "a", "first");
    staged.commit();
  }
  EXPECT_EQ(read_text(final_path / "a"), "first");
  {
    StagedDirectory staged(final_path);
    write_text(staged.staging_path() / "b", "second");
    staged.commit();  // swaps out the existing directory
  }
  EXPECT_FALSE(fs::exists(final_path / "a"));
  EXPECT_EQ(read_text(final_path / "b"), "second");
  EXPECT_FALSE(has_staging_leftovers(dir.path()));
  EXPECT_TRUE(is_staging_name("iter_0000042.tmp-AbC123"));
  EXPECT_FALSE(is_staging_name("iter_0000042"));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

RunConfig tiny_run_config() {
  RunConfig config;
  config.model.num_layers = 2;
  config.model.hidden_size = 16;
  config.model.ffn_hidden_size = 24;
  config.model.num_attention_heads = 4;
  config.model.num_query_groups = 2;  // GQA: k/v projections are [8, 16]
  config.model.seq_length = 8;
  config.batch.global_batch_size = 4;
  config.schedule.lr = 0.5;
  config.schedule.train_samples = 64;
  config.schedule.lr_decay_samples = 64;
  return config;
}

// The Hugging Face Llama tensors of SPEC 12, spelled out here independently of
// expected_llama_tensors so the two check each other.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> llama_names_and_shapes(
    const RunConfig& config) {
  const auto& m = config.model;
  const std::int64_t kv = m.num_query_groups * m.head_dim();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> tensors{
      {"model.embed_tokens.weight", {m.padded_vocab_size, m.hidden_size}}};
  for (std::int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    tensors.push_back({p + "input_layernorm.weight", {m.hidden_size}});
    tensors.push_back({p + "self_attn.q_proj.weight", {m.hidden_size, m.hidden_size}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kv, m.hidden_size}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kv, m.hidden_size}});
    tensors.push_back({p + "self_attn.o_proj.weight", {m.hidden_size, m.hidden_size}});
    tensors.push_back({p + "post_attention_layernorm.weight", {m.hidden_size}});
    tensors.push_back({p + "mlp.gate_proj.weight", {m.ffn_hidden_size, m.hidden_size}});
    tensors.push_back({p + "mlp.up_proj.weight", {m.ffn_hidden_size, m.hidden_size}});
    tensors.push_back({p + "mlp.down_proj.weight", {m.hidden_size, m.ffn_hidden_size}});
  }
  tensors.push_back({"model.norm.weight", {m.hidden_size}});
  if (!m.tie_embeddings) tensors.push_back({"lm_head.weight", {m.padded_vocab_size, m.hidden_size}});
  return tensors;
}

// A checkpoint state whose every value is known: model tensors of dyadic values in `precision`,
// moments derived from them, counters and trainer-owned JSON with distinct numbers.
CheckpointState known_state(const RunConfig& config, std::int64_t iteration,
                            const std::string& precision = "F64") {
  CheckpointState state;
  state.engine = precision == "F64" ? "reference" : "production";
  state.precision = precision;
  to_json(state.run_config, config);
  state.parallel_layout = state.run_config.at("parallel");
  state.counters = {iteration, iteration * 4, iteration - 1, 1, 0, iteration * 31, iteration * 29, 2};
  state.counters.scheduler_samples = (iteration - 1) * 4;
  state.data_position = {{"next_global_sample", iteration * 4}};
  state.random_streams = {{"seed", 1234}, {"dropout", {{"counter", 7}}}};
  const auto shapes = llama_names_and_shapes(config);
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const auto& [name, shape] = shapes[t];
    std::vector<double> values(static_cast<std::size_t>(element_count(shape)));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = dyadic_value(t, i) + iteration;
    auto tensor = make_f64_tensor(name, shape, values);
    if (precision != "F64") tensor = convert_tensor(tensor, precision);
    state.model_tensors.push_back(tensor);
    for (auto& value : values) value = value * value / 8.0;
    auto exp_avg = make_f64_tensor("exp_avg." + name, shape, values);
    auto exp_avg_sq = make_f64_tensor("exp_avg_sq." + name, shape, values);
    if (precision != "F64") {
      exp_avg = convert_tensor(exp_avg, precision);
      exp_avg_sq = convert_tensor(exp_avg_sq, precision);
    }
    state.optimizer_tensors.push_back(exp_avg);
    state.optimizer_tensors.push_back(exp_avg_sq);
  }
  state.model_tensors = sorted_by_name(state.model_tensors);  // the order a load returns
  state.optimizer_tensors = sorted_by_name(state.optimizer_tensors);
  return state;
}

TEST(Checkpoint, SaveThenLoadIsBitExactInBothPrecisions) {
  const RunConfig config = tiny_run_config();
  for (const std::string precision : {"F64", "F32"}) {
    SCOPED_TRACE(precision);
    TempDir dir;
    CheckpointState state = known_state(config, 42, precision);
    // Values that only an exact copy preserves: -0, the smallest subnormal, a NaN payload.
    auto& first = state.model_tensors.front();
    const std::size_t element = dtype_size(precision);
    std::memset(first.bytes.data(), 0, element);
    first.bytes[element - 1] = std::byte{0x80};                      // -0
    first.bytes[element] = std::byte{0x01};                          // smallest subnormal
    std::memset(first.bytes.data() + element + 1, 0, element - 1);
    std::memset(first.bytes.data() + 2 * element, 0xFF, element);  // NaN with a full payload

    const fs::path written = save_checkpoint(dir.path(), state);
    EXPECT_EQ(written, dir.path() / "iter_0000042");
    EXPECT_EQ(read_text(dir.path() / "latest_checkpointed_iteration.txt"), "42");
    EXPECT_EQ(read_latest_iteration(dir.path()), 42);
    const CheckpointState loaded = load_checkpoint(dir.path());
    EXPECT_EQ(loaded, state);  // every counter, every JSON field, every tensor byte

    const json manifest = json::parse(read_text(written / "manifest.json"));
    EXPECT_EQ(manifest.at("format"), "tandem-checkpoint");
    EXPECT_EQ(manifest.at("format_version"), 1);
    EXPECT_EQ(manifest.at("precision"), precision);
    EXPECT_EQ(manifest.at("scheduler").at("settings").at("lr"), 0.5);
    EXPECT_EQ(manifest.at("optimizer").at("settings").at("adam_beta2"), 0.999);
    for (const char* counter : {"iteration", "consumed_samples", "successful_updates",
                                "skipped_updates", "consecutive_skips", "input_tokens",
                                "loss_tokens", "pad_tokens"}) {
      EXPECT_TRUE(manifest.at("counters").contains(counter)) << counter;
    }
    const FileDigest model_digest = digest_file(written / "model.safetensors");
    EXPECT_EQ(manifest.at("files").at("model.safetensors").at("size_bytes"), model_digest.size_bytes);
    EXPECT_EQ(manifest.at("files").at("model.safetensors").at("crc32"), crc32_hex(model_digest.crc32));
  }
}

TEST(Checkpoint, LoadsTheLatestAGivenIterationOrAnIterDirectory) {
  const RunConfig config = tiny_run_config();
  TempDir dir;
  const auto first = known_state(config, 1);
  const auto second = known_state(config, 2);
  save_checkpoint(dir.path(), first);
  save_checkpoint(dir.path(), second);
  EXPECT_EQ(load_checkpoint(dir.path()), second);
  EXPECT_EQ(load_checkpoint(dir.path(), {.iteration = 1, .read_optimizer = true}), first);
  EXPECT_EQ(load_checkpoint(dir.path() / "iter_0000001"), first);
  const auto model_only = load_checkpoint(dir.path(), {.iteration = {}, .read_optimizer = false});
  EXPECT_TRUE(model_only.optimizer_tensors.empty());
  EXPECT_EQ(model_only.model_tensors, second.model_tensors);
  // Saving an iteration again replaces it whole.
  auto again = known_state(config, 2);
  again.counters.pad_tokens = 99;
  save_checkpoint(dir.path(), again);
  EXPECT_EQ(load_checkpoint(dir.path()).counters.pad_tokens, 99);
}

// A checkpoint gets the modes the user's umask gives any new file (mkdtemp and mkstemp made them
// 0700 and 0600, so a team could not read them on a shared file system).
TEST(Checkpoint, ItsDirectoriesAndFilesFollowTheUmask) {
  const RunConfig config = tiny_run_config();
  for (const mode_t mask : {mode_t{022}, mode_t{027}}) {
    const mode_t previous = ::umask(mask);
    TempDir dir;
    const fs::path iter_dir = save_checkpoint(dir.path(), known_state(config, 3));
    ::umask(previous);
    const auto mode = [](const fs::path& path) { return static_cast<mode_t>(fs::status(path).permissions()) & 0777; };
    EXPECT_EQ(mode(iter_dir), 0777 & ~mask) << iter_dir;
    for (const auto& entry : fs::directory_iterator(iter_dir)) EXPECT_EQ(mode(entry.path()), 0666 & ~mask) << entry.path();
    EXPECT_EQ(mode(dir.path() / "latest_checkpointed_iteration.txt"), 0666 & ~mask);
  }
}

TEST(Checkpoint, RefusesTensorsNotInTheMainPrecision) {
  TempDir dir;
  auto state = known_state(tiny_run_config(), 3);
  state.model_tensors[1] = convert_tensor(state.model_tensors[1], "F32");
  expect_error([&] { save_checkpoint(dir.path(), state); },
               {"tensor " + state.model_tensors[1].name, "F32", "precision is F64"});
  state = known_state(tiny_run_config(), 3);
  state.precision = "BF16";
  expect_error([&] { save_checkpoint(dir.path(), state); }, {"precision \"BF16\""});
  EXPECT_FALSE(fs::exists(dir.path() / "iter_0000003"));
}

TEST(Checkpoint, RefusesEveryCorruptionNamingTheFile) {
  const RunConfig config = tiny_run_config();
  struct Corruption {
    const char* name;
    std::function<void(const fs::path& iter_dir)> damage;
    std::string file;                  // the file the error must name (relative to the save dir)
    std::vector<std::string> needles;  // what the error must say
  };
  auto flip_byte = [](const fs::path& path, std::size_t from_end) {
    auto bytes = read_bytes(path);
    bytes[bytes.size() - from_end] ^= std::byte{0x01};
    write_bytes(path, bytes);
  };
  auto truncate = [](const fs::path& path, std::size_t by) {
    fs::resize_file(path, fs::file_size(path) - by);
  };
  // Rewrites iter_dir's manifest through `edit`, resealed (its checksum recomputed) or not.
  auto edit_manifest = [](const fs::path& iter_dir, const std::function<void(json&)>& edit, bool reseal = true) {
    auto manifest_json = json::parse(read_text(iter_dir / "manifest.json"));
    edit(manifest_json);
    if (reseal) manifest::seal(manifest_json);
    write_text(iter_dir / "manifest.json", manifest_json.dump(2));
  };
  const std::vector<Corruption> corruptions{
      {"model-byte-flipped", [&](const fs::path& d) { flip_byte(d / "model.safetensors", 5); },
       "iter_0000007/model.safetensors", {"CRC-32", "corrupt"}},
      {"optimizer-truncated", [&](const fs::path& d) { truncate(d / "optimizer.safetensors", 4); },
       "iter_0000007/optimizer.safetensors", {"the manifest recorded", "truncated"}},
      {"model-missing", [](const fs::path& d) { fs::remove(d / "model.safetensors"); },
       "iter_0000007/model.safetensors", {"missing"}},
      {"manifest-truncated", [&](const fs::path& d) { truncate(d / "manifest.json", 40); },
       "iter_0000007/manifest.json", {"not valid JSON"}},
      {"manifest-missing", [](const fs::path& d) { fs::remove(d / "manifest.json"); },
       "iter_0000007/manifest.json", {"cannot be opened", "incomplete"}},
      // An edit of any field is caught by the manifest's checksum: consumed_samples moved from 28
      // to 32 would resume on other samples (it did, with exit 0).
      {"manifest-consumed-samples-edited",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["counters"]["consumed_samples"] = 32; }, false); },
       "iter_0000007/manifest.json",
       {"field \"manifest_crc32\" holds \"", "the manifest's content has CRC-32", "restore the original manifest.json"}},
      {"manifest-checksum-mistyped",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["manifest_crc32"] = 7; }, false); },
       "iter_0000007/manifest.json", {"field \"manifest_crc32\" holds 7", "8 hex digits"}},
      // The cases below reseal the manifest after the edit, as a careful editor would, and are
      // caught by the check of the field.
      {"manifest-field-missing",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m.at("counters").erase("pad_tokens"); }); },
       "iter_0000007/manifest.json", {"\"pad_tokens\" is missing", "fix:"}},
      {"manifest-section-missing",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m.erase("data_position"); }); },
       "iter_0000007/manifest.json", {"\"data_position\" is missing"}},
      {"manifest-counter-wrong-type",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["counters"]["consumed_samples"] = "28"; }); },
       "iter_0000007/manifest.json", {"\"consumed_samples\" holds \"28\", not an integer"}},
      {"manifest-counter-fraction",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["counters"]["loss_tokens"] = 203.5; }); },
       "iter_0000007/manifest.json", {"\"loss_tokens\" holds 203.5, not an integer"}},
      {"manifest-counter-negative",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["counters"]["input_tokens"] = -5; }); },
       "iter_0000007/manifest.json", {"\"counters.input_tokens\" holds -5", "never negative"}},
      {"manifest-section-wrong-type",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["random_streams"] = "seed 1234"; }); },
       "iter_0000007/manifest.json", {"\"random_streams\" holds \"seed 1234\", not an object"}},
      {"manifest-engine-unknown",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["engine"] = "cpu"; }); },
       "iter_0000007/manifest.json", {"\"engine\" holds \"cpu\"", "\"reference\" or \"production\""}},
      {"manifest-data-position-disagrees",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["counters"]["consumed_samples"] = 32; }); },
       "iter_0000007/manifest.json",
       {"\"data_position.next_global_sample\" holds 28", "must equal counters.consumed_samples (32)"}},
      {"manifest-updates-and-skips-disagree",
       [&](const fs::path& d) {
         edit_manifest(d, [](json& m) {
           m["counters"]["successful_updates"] = 5;  // 6 updates + 1 skip made iteration 7
           m["optimizer"]["step"] = 5;
         });
       },
       "iter_0000007/manifest.json", {"\"counters.iteration\" holds 7", "successful_updates + skipped_updates (5 + 1)"}},
      {"manifest-more-consecutive-than-all-skips",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["counters"]["consecutive_skips"] = 2; }); },
       "iter_0000007/manifest.json", {"\"counters.consecutive_skips\" holds 2", "cannot exceed skipped_updates (1)"}},
      {"manifest-other-format",
       [&](const fs::path& d) { edit_manifest(d, [](json& m) { m["format_version"] = 4; }); },
       "iter_0000007/manifest.json", {"format_version is 4"}},
      // A damaged file whose checksum was updated too: the safetensors validation still refuses it.
      {"model-header-damaged-checksum-updated",
       [&](const fs::path& d) {
         auto bytes = read_bytes(d / "model.safetensors");
         bytes[2] = std::byte{0x7F};  // header length now about 8 MB: past the end, under the limit
         write_bytes(d / "model.safetensors", bytes);
         edit_manifest(d, [&](json& m) {
           m["files"]["model.safetensors"]["crc32"] = crc32_hex(digest_file(d / "model.safetensors").crc32);
         });
       },
       "iter_0000007/model.safetensors", {"header length", "past the end"}},
      {"tracker-garbage",
       [](const fs::path& d) { write_text(d.parent_path() / "latest_checkpointed_iteration.txt", "release"); },
       "latest_checkpointed_iteration.txt", {"\"release\""}},
      {"tracker-names-absent-iteration",
       [](const fs::path& d) { write_text(d.parent_path() / "latest_checkpointed_iteration.txt", "8"); },
       "iter_0000008", {"does not exist"}},
  };
  for (const auto& corruption : corruptions) {
    SCOPED_TRACE(corruption.name);
    TempDir dir;
    const auto state = known_state(config, 7);
    const fs::path iter_dir = save_checkpoint(dir.path(), state);
    ASSERT_EQ(load_checkpoint(dir.path()), state);  // the control: intact, it loads
    corruption.damage(iter_dir);
    auto needles = corruption.needles;
    needles.push_back((dir.path() / corruption.file).string());
    expect_error([&] { load_checkpoint(dir.path()); }, needles);
  }
  // Whitespace around the tracker's number is stripped, as Megatron's int(f.read().strip()): a
  // tracker holding " 7" (or "7\t\n") loads (it was refused).
  for (const char* padded : {" 7", "7\t\n", "  7  \n"}) {
    TempDir dir;
    const auto state = known_state(config, 7);
    save_checkpoint(dir.path(), state);
    write_text(dir.path() / "latest_checkpointed_iteration.txt", padded);
    EXPECT_EQ(load_checkpoint(dir.path()), state) << "tracker \"" << padded << "\"";
  }
  // A manifest written before manifests had a checksum still loads (its fields are checked).
  {
    TempDir dir;
    const auto state = known_state(config, 7);
    const fs::path iter_dir = save_checkpoint(dir.path(), state);
    auto manifest_json = json::parse(read_text(iter_dir / "manifest.json"));
    ASSERT_EQ(manifest_json.at("manifest_crc32"), manifest::manifest_checksum(manifest_json));
    manifest_json.erase("manifest_crc32");
    write_text(iter_dir / "manifest.json", manifest_json.dump(2));
    EXPECT_EQ(load_checkpoint(dir.path()), state);
  }
  TempDir empty;
  expect_error([&] { load_checkpoint(empty.path()); }, {empty.path().string(), "neither"});
  expect_error([&] { load_checkpoint(empty.path() / "absent"); }, {"does not exist"});
}

// A failure at any point of a save leaves the previous checkpoint and tracker as they were and no
// partial directory in sight.
TEST(Checkpoint, AnInterruptedSaveNeverDamagesThePreviousCheckpoint) {
  const RunConfig config = tiny_run_config();
  struct SimulatedFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  for (const std::string failing_step :
       {"model.safetensors", "optimizer.safetensors", "manifest.json", "directory"}) {
    for (const std::int64_t next_iteration : {2, 1}) {  // a new iteration, or re-saving the same
      SCOPED_TRACE(failing_step + " while saving iteration " + std::to_string(next_iteration));
      TempDir dir;
      const auto previous = known_state(config, 1);
      save_checkpoint(dir.path(), previous);
      auto next = known_state(config, next_iteration);
      next.counters.pad_tokens = 1000;  // distinguishes a re-save of the same iteration
      SaveHooks hooks;
      hooks.after_step = [&](std::string_view step) {
        if (step == failing_step) throw SimulatedFailure("simulated failure after " + failing_step);
      };
      EXPECT_THROW(save_checkpoint(dir.path(), next, hooks), SimulatedFailure);

      EXPECT_EQ(read_text(dir.path() / "latest_checkpointed_iteration.txt"), "1");
      EXPECT_FALSE(has_staging_leftovers(dir.path()));
      if (failing_step == "directory") {
        // The new directory was complete and in place; only the tracker was not yet moved.
        EXPECT_EQ(load_checkpoint(dir.path() / iteration_directory_name(next_iteration)), next);
        if (next_iteration != 1) {
          EXPECT_EQ(load_checkpoint(dir.path()), previous);
        }
      } else {
        EXPECT_EQ(load_checkpoint(dir.path()), previous);
        EXPECT_EQ(fs::exists(dir.path() / "iter_0000002"), false);
      }
    }
  }
}

TEST(Checkpoint, ASaveClearsWhatACrashedSaveLeftBehind) {
  const RunConfig config = tiny_run_config();
  TempDir dir;
  save_checkpoint(dir.path(), known_state(config, 1));
  // A process killed mid-save leaves its staging directory and temporary tracker.
  fs::create_directory(dir.path() / "iter_0000002.tmp-Zq81xA");
  write_text(dir.path() / "iter_0000002.tmp-Zq81xA" / "model.safetensors", "partial");
  write_text(dir.path() / "latest_checkpointed_iteration.txt.tmp-r2D2c3", "2");
  write_text(dir.path() / "notes.tmp-keepme", "not ours");  // not a staging name: untouched
  EXPECT_EQ(load_checkpoint(dir.path()).counters.iteration, 1);
  save_checkpoint(dir.path(), known_state(config, 2));
  EXPECT_FALSE(fs::exists(dir.path() / "iter_0000002.tmp-Zq81xA"));
  EXPECT_FALSE(fs::exists(dir.path() / "latest_checkpointed_iteration.txt.tmp-r2D2c3"));
  EXPECT_TRUE(fs::exists(dir.path() / "notes.tmp-keepme"));
  EXPECT_EQ(load_checkpoint(dir.path()).counters.iteration, 2);
}

// ---------------------------------------------------------------------------------------------
// Resume settings (SPEC 9)

// The run's settings as a checkpoint records them: what a resume is compared against.
json saved_settings(const RunConfig& config) {
  json saved;
  to_json(saved, config);
  return saved;
}

TEST(ResumeSettings, AnUnchangedRunHasNoChanges) {
  const RunConfig config = tiny_run_config();
  json saved = saved_settings(config);
  EXPECT_TRUE(changed_resume_settings(saved, config).empty());
  EXPECT_TRUE(check_resume_settings(saved, config).empty());
  // Settings outside the comparison may change: more training samples, another save interval.
  RunConfig longer = config;
  longer.schedule.train_samples *= 2;
  longer.checkpoint.save_interval = 5;
  longer.batch.micro_batch_size = 2;
  EXPECT_TRUE(changed_resume_settings(saved, longer).empty());
}

TEST(ResumeSettings, ListsEveryChangedSettingAndRefusesWithoutOverride) {
  const RunConfig config = tiny_run_config();
  json saved = saved_settings(config);
  RunConfig resumed = config;
  resumed.schedule.lr = 0.25;
  resumed.schedule.lr_decay_style = LrDecayStyle::cosine;
  resumed.optimizer.adam_beta2 = 0.95;
  resumed.batch.global_batch_size = 8;
  resumed.schedule.weight_decay_incr_style = WeightDecayIncrStyle::linear;
  const auto changes = changed_resume_settings(saved, resumed);
  std::vector<std::string> arguments;
  for (const auto& change : changes) {
    arguments.push_back(change.argument);
    EXPECT_TRUE(change.overridable) << change.argument;
  }
  EXPECT_EQ(arguments, (std::vector<std::string>{"--lr", "--lr-decay-style", "--weight-decay-incr-style",
                                                 "--adam-beta2", "--global-batch-size"}));
  EXPECT_EQ(changes[0].saved, "0.5");
  EXPECT_EQ(changes[0].resumed, "0.25");
  EXPECT_EQ(changes[1].saved, "\"linear\"");

  try {
    check_resume_settings(saved, resumed);
    ADD_FAILURE() << "a changed lr was accepted without --override-opt-param-scheduler";
  } catch (const ConfigError& error) {
    ASSERT_EQ(error.issues().size(), 5u);
    EXPECT_EQ(error.issues()[0].field, "--lr");
    EXPECT_NE(error.issues()[0].fix.find("--override-opt-param-scheduler"), std::string::npos);
  }
  resumed.checkpoint.override_opt_param_scheduler = true;
  EXPECT_EQ(check_resume_settings(saved, resumed).size(), 5u);
}

TEST(ResumeSettings, AModelShapeChangeIsRefusedEvenWithOverride) {
  const RunConfig config = tiny_run_config();
  json saved = saved_settings(config);
  RunConfig resumed = config;
  resumed.model.hidden_size = 32;
  resumed.model.tie_embeddings = true;
  resumed.checkpoint.override_opt_param_scheduler = true;
  const auto changes = changed_resume_settings(saved, resumed);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_FALSE(changes[0].overridable);
  EXPECT_THROW(check_resume_settings(saved, resumed), ConfigError);
  // A checkpoint that did not record a setting counts as changed, shown as <absent>.
  saved["schedule"].erase("min_lr");
  const auto absent = changed_resume_settings(saved, config);
  ASSERT_EQ(absent.size(), 1u);
  EXPECT_EQ(absent[0].argument, "--min-lr");
  EXPECT_EQ(absent[0].saved, "<absent>");
}

// ---------------------------------------------------------------------------------------------
// `tandem export` through the real binary (SPEC 12)

TEST(Export, ExpectedTensorsMatchTheSpecNames) {
  for (const bool tied : {false, true}) {
    RunConfig config = tiny_run_config();
    config.model.tie_embeddings = tied;
    json run_config;
    to_json(run_config, config);
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> got;
    for (const auto& expected : expected_llama_tensors(run_config)) got.push_back({expected.name, expected.shape});
    EXPECT_EQ(got, llama_names_and_shapes(config));
  }
}

TEST(Export, WritesConfigAndWeightsLoadableByName) {
  RunConfig config = tiny_run_config();
  TempDir dir;
  const fs::path save = dir.path() / "save";
  const CheckpointState state = known_state(config, 5);  // F64, the reference's precision
  save_checkpoint(save, state);

  const fs::path out = dir.path() / "hf";
  const auto result = run_command(std::string(TANDEM_BINARY) + " export --load " + quoted(save) +
                                  " --hf " + quoted(out));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("exported iteration 5"), std::string::npos) << result.output;
  EXPECT_EQ(std::vector<fs::path>(fs::directory_iterator(out), fs::directory_iterator()).size(), 2u);
  EXPECT_FALSE(has_staging_leftovers(dir.path()));

  const json hf_config = json::parse(read_text(out / "config.json"));
  EXPECT_EQ(hf_config.at("architectures"), json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(hf_config.at("model_type"), "llama");
  EXPECT_EQ(hf_config.at("hidden_size"), 16);
  EXPECT_EQ(hf_config.at("intermediate_size"), 24);
  EXPECT_EQ(hf_config.at("num_hidden_layers"), 2);
  EXPECT_EQ(hf_config.at("num_attention_heads"), 4);
  EXPECT_EQ(hf_config.at("num_key_value_heads"), 2);
  EXPECT_EQ(hf_config.at("vocab_size"), 384);  // 258 padded to a multiple of 128 (SPEC 12)
  EXPECT_EQ(hf_config.at("max_position_embeddings"), 8);
  EXPECT_EQ(hf_config.at("rms_norm_eps"), 1e-5);
  EXPECT_EQ(hf_config.at("rope_theta"), 10000.0);
  EXPECT_EQ(hf_config.at("attention_bias"), false);
  EXPECT_EQ(hf_config.at("mlp_bias"), false);
  EXPECT_EQ(hf_config.at("tie_word_embeddings"), false);
  EXPECT_EQ(hf_config.at("hidden_act"), "silu");
  EXPECT_EQ(hf_config.at("torch_dtype"), "float32");
  EXPECT_EQ(hf_config.at("eos_token_id"), 256);

  const auto exported = read_safetensors(out / "model.safetensors");
  EXPECT_EQ(exported.metadata.at("format"), "pt");
  ASSERT_EQ(exported.tensors.size(), state.model_tensors.size());
  for (const auto& stored : state.model_tensors) {
    const auto& tensor = find_tensor(exported.tensors, stored.name, "export");
    EXPECT_EQ(tensor.dtype, "F32");
    EXPECT_EQ(tensor.shape, stored.shape);
    EXPECT_EQ(tensor, convert_tensor(stored, "F32")) << stored.name;
  }

  // bf16: every element rounded to nearest even straight from the stored double.
  const fs::path out_bf16 = dir.path() / "hf-bf16";
  const auto bf16_result = run_command(std::string(TANDEM_BINARY) + " export --load " +
                                       quoted(save / "iter_0000005") + " --hf " +
                                       quoted(out_bf16) + " --dtype bf16");
  ASSERT_EQ(bf16_result.exit_code, 0) << bf16_result.output;
  EXPECT_EQ(json::parse(read_text(out_bf16 / "config.json")).at("torch_dtype"), "bfloat16");
  const auto exported_bf16 = read_safetensors(out_bf16 / "model.safetensors");
  for (const auto& stored : state.model_tensors) {
    const auto& tensor = find_tensor(exported_bf16.tensors, stored.name, "export");
    const auto bits = bf16_bits(tensor);
    const auto values = f64_values(stored);
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(bits[i], bf16_from_double(values[i])) << stored.name << "[" << i << "]";
    }
  }
}

TEST(Export, TiedEmbeddingsOmitTheOutputProjection) {
  RunConfig config = tiny_run_config();
  config.model.tie_embeddings = true;
  TempDir dir;
  auto state = known_state(config, 3, "F32");  // production precision
  // A checkpoint that stored lm_head.weight anyway: the export drops it.
  state.model_tensors.push_back(find_tensor(state.model_tensors, "model.embed_tokens.weight", "test"));
  state.model_tensors.back().name = "lm_head.weight";
  save_checkpoint(dir.path() / "save", state);
  const auto result = run_command(std::string(TANDEM_BINARY) + " export --load " +
                                  quoted(dir.path() / "save") + " --hf " +
                                  quoted(fs::path((dir.path() / "hf").string() + "/")));  // "OUT/" names OUT
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_FALSE(has_staging_leftovers(dir.path()));
  EXPECT_EQ(json::parse(read_text(dir.path() / "hf" / "config.json")).at("tie_word_embeddings"), true);
  const auto exported = read_safetensors(dir.path() / "hf" / "model.safetensors");
  for (const auto& tensor : exported.tensors) EXPECT_NE(tensor.name, "lm_head.weight");
  EXPECT_EQ(exported.tensors.size(), state.model_tensors.size() - 1);
}

TEST(Export, FailuresLeaveNoPartialOutput) {
  const RunConfig config = tiny_run_config();
  TempDir dir;
  const fs::path save = dir.path() / "save";
  save_checkpoint(save, known_state(config, 4));
  const std::string binary = TANDEM_BINARY;

  // A corrupted checkpoint: refused naming the file, nothing created.
  auto bytes = read_bytes(save / "iter_0000004" / "model.safetensors");
  bytes[bytes.size() / 2] ^= std::byte{0x40};
  write_bytes(save / "iter_0000004" / "model.safetensors", bytes);
  auto result = run_command(binary + " export --load " + quoted(save) + " --hf " + quoted(dir.path() / "hf"));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find((save / "iter_0000004" / "model.safetensors").string()), std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(dir.path() / "hf"));
  EXPECT_FALSE(has_staging_leftovers(dir.path()));

  // A tensor missing from the model: refused naming it.
  save_checkpoint(save, known_state(config, 4));
  auto state = known_state(config, 6);
  state.model_tensors.erase(state.model_tensors.begin() + 3);
  const std::string missing = known_state(config, 6).model_tensors[3].name;
  save_checkpoint(save, state);
  result = run_command(binary + " export --load " + quoted(save) + " --hf " + quoted(dir.path() / "hf"));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find(missing), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(dir.path() / "hf"));

  // An existing, non-empty output is never overwritten.
  fs::create_directories(dir.path() / "taken");
  write_text(dir.path() / "taken" / "keep.txt", "user file");
  result = run_command(binary + " export --load " + quoted(save / "iter_0000004") + " --hf " +
                       quoted(dir.path() / "taken"));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("already exists"), std::string::npos) << result.output;
  EXPECT_EQ(read_text(dir.path() / "taken" / "keep.txt"), "user file");

  // An unknown dtype is a usage error (exit 2).
  result = run_command(binary + " export --load " + quoted(save) + " --hf " +
                       quoted(dir.path() / "hf") + " --dtype f16");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_FALSE(fs::exists(dir.path() / "hf"));
}

// A killed export leaves its staging directory OUT.tmp-XXXXXX (nothing removed them: 636 MB after
// 37 kills). The next export to OUT removes those no process holds and says so; a live export's
// (its flock held) and other names stay.
TEST(Export, TheNextExportRemovesWhatKilledExportsLeft) {
  TempDir dir;
  const fs::path save = dir.path() / "save";
  save_checkpoint(save, known_state(tiny_run_config(), 4));
  const fs::path abandoned = dir.path() / "hf.tmp-Ab12Cd";
  const fs::path live = dir.path() / "hf.tmp-Live01";
  const fs::path unrelated = dir.path() / "other.tmp-Zz99Yy";
  for (const auto& staging : {abandoned, live, unrelated}) {
    fs::create_directories(staging);
    write_text(staging / "model.safetensors", "partial");
  }
  const int live_lock = ::open(live.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(live_lock, 0);
  ASSERT_EQ(::flock(live_lock, LOCK_EX | LOCK_NB), 0);
  const auto result = run_command(std::string(TANDEM_BINARY) + " export --load " + quoted(save) + " --hf " +
                                  quoted(dir.path() / "hf"));
  ::close(live_lock);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("note: removed " + abandoned.string() + ", left by an export that was killed"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(live / "model.safetensors"));
  EXPECT_TRUE(fs::exists(unrelated / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path() / "hf" / "model.safetensors"));
  EXPECT_EQ(result.output.find("removed " + live.string()), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem::checkpoint
