// --data-cache-path for --data-order megatron (core/data/megatron_index_cache.cpp; docs/DATA.md
// section 4): the indices are built once, written atomically and memory-mapped after; a loaded
// index equals the one built in memory entry for entry (exact); a truncated, corrupted or foreign
// file is refused and rebuilt; threads and processes opening one index at once build it once.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/data/indexed_dataset.hpp"
#include "core/data/megatron_order.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using data::IndexOrigin;
using data::MegatronGptIndex;

class MegatronIndexCache : public ::testing::Test {
 protected:
  fs::path root_;
  fs::path cache_;
  std::shared_ptr<const data::IndexedDataset> dataset_;
  data::SequenceRange range_;
  // 40 documents of 2..38 tokens, EOD included: E = 703 + 6 + 40 = 749 tokens. 250 samples of
  // 7 tokens need 250 x 7 + 1 = 1751 tokens: 3 epochs, the last shuffled apart (it supplies
  // 250 - (2 x 749 - 1) // 7 = 37 samples, fewer than int(0.8 x (749 - 1) // 7) = 84), and the
  // dataset holds (3 x 749 - 1) // 7 = 320 samples.
  data::MegatronOrderConfig config_{7, 250, 1234};

  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("tandem-index-cache-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    cache_ = root_ / "cache";
    data::IndexedDatasetWriterConfig writer_config;
    writer_config.prefix = (root_ / "docs").string();
    data::IndexedDatasetWriter writer(writer_config);
    for (int document = 0; document < 40; ++document) {
      writer.add_document(std::vector<std::int32_t>(static_cast<std::size_t>(document % 37 + 1), document));
    }
    writer.finish();
    dataset_ = std::make_shared<const data::IndexedDataset>(data::IndexedDataset::open(writer_config.prefix));
    range_ = {0, dataset_->sequence_count()};
  }
  void TearDown() override { fs::remove_all(root_); }

  std::shared_ptr<const MegatronGptIndex> open_cached() const {
    return MegatronGptIndex::open(*dataset_, range_, config_, cache_.string());
  }

  std::vector<fs::path> cache_files() const {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(cache_)) {
      if (entry.path().extension() == ".bin") files.push_back(entry.path());
    }
    return files;
  }

  // Exact: every array entry and every sample's window of `loaded` equals `built`'s.
  static void expect_same_indices(const MegatronGptIndex& built, const MegatronGptIndex& loaded) {
    ASSERT_EQ(built.sample_count(), loaded.sample_count());
    EXPECT_EQ(built.epochs(), loaded.epochs());
    EXPECT_EQ(built.separate_final_epoch(), loaded.separate_final_epoch());
    EXPECT_TRUE(std::ranges::equal(built.document_index(), loaded.document_index()));
    for (std::int64_t sample = 0; sample < built.sample_count(); ++sample) {
      ASSERT_EQ(built.shuffled(sample), loaded.shuffled(sample)) << "sample " << sample;
      const auto want = built.place(built.window_begin(sample));
      const auto got = loaded.place(loaded.window_begin(sample));
      ASSERT_EQ(want.entry, got.entry) << "sample " << sample;
      ASSERT_EQ(want.offset, got.offset) << "sample " << sample;
    }
  }
};

TEST_F(MegatronIndexCache, IsBuiltOnceThenLoadedWithIdenticalSamples) {
  const MegatronGptIndex in_memory(*dataset_, range_, config_);
  ASSERT_EQ(in_memory.epochs(), 3);
  ASSERT_TRUE(in_memory.separate_final_epoch());
  ASSERT_EQ(in_memory.sample_count(), 320);
  EXPECT_EQ(in_memory.origin(), IndexOrigin::built);

  ::testing::internal::CaptureStderr();
  const auto first = open_cached();
  const auto second = open_cached();
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first->origin(), IndexOrigin::built_and_cached);
  EXPECT_EQ(second->origin(), IndexOrigin::loaded);
  EXPECT_NE(said.find("built and cached in " + first->cache_file() + " in "), std::string::npos) << said;
  EXPECT_NE(said.find("loaded from " + first->cache_file() + " in "), std::string::npos) << said;
  EXPECT_EQ(cache_files().size(), 1u);
  expect_same_indices(in_memory, *first);
  expect_same_indices(in_memory, *second);
}

TEST_F(MegatronIndexCache, EachConfigurationHasItsOwnFile) {
  const auto first = open_cached();
  config_.seed = 1235;
  const auto reseeded = open_cached();
  EXPECT_EQ(reseeded->origin(), IndexOrigin::built_and_cached);
  EXPECT_NE(first->cache_file(), reseeded->cache_file());
  expect_same_indices(MegatronGptIndex(*dataset_, range_, config_), *open_cached());
  // Negative control: the two seeds' orders differ, so comparing them would fail.
  EXPECT_FALSE(std::ranges::equal(first->document_index(), reseeded->document_index()));
}

// Each damage is refused with its reason on stderr; the file is rebuilt (never used) and the
// samples are the in-memory ones; the next start loads the repaired file.
TEST_F(MegatronIndexCache, ADamagedFileIsRefusedAndRebuilt) {
  const MegatronGptIndex in_memory(*dataset_, range_, config_);
  const fs::path file = open_cached()->cache_file();
  const auto size = fs::file_size(file);
  struct Damage {
    const char* name;
    std::function<void()> apply;
    const char* reason;
  };
  const std::vector<Damage> damages = {
      {"truncated by 8 bytes", [&] { fs::resize_file(file, size - 8); }, "truncated or extended"},
      {"truncated inside the header", [&] { fs::resize_file(file, 20); }, "truncated: shorter than its header"},
      {"one shuffle byte flipped",
       [&] {
         std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
         bytes.seekp(static_cast<std::streamoff>(size - 40));
         char byte = 0;
         bytes.seekg(static_cast<std::streamoff>(size - 40));
         bytes.read(&byte, 1);
         byte = static_cast<char>(byte ^ 0x10);
         bytes.seekp(static_cast<std::streamoff>(size - 40));
         bytes.write(&byte, 1);
       },
       "corrupt: its checksum does not match"},
      {"another configuration's file under this name",
       [&] {
         auto other = config_;
         other.num_samples = 10;
         const fs::path other_file = MegatronGptIndex::open(*dataset_, range_, other, cache_.string())->cache_file();
         fs::copy_file(other_file, file, fs::copy_options::overwrite_existing);
       },
       "built for another dataset or configuration"},
  };
  for (const auto& damage : damages) {
    SCOPED_TRACE(damage.name);
    damage.apply();
    ::testing::internal::CaptureStderr();
    const auto rebuilt = open_cached();
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(rebuilt->origin(), IndexOrigin::built_and_cached);
    EXPECT_NE(said.find(damage.reason), std::string::npos) << said;
    EXPECT_NE(said.find("rebuilding it"), std::string::npos) << said;
    expect_same_indices(in_memory, *rebuilt);
    EXPECT_EQ(open_cached()->origin(), IndexOrigin::loaded);
    EXPECT_EQ(fs::file_size(file), size);
  }
}

TEST_F(MegatronIndexCache, AnUnusableDirectoryIsAClearError) {
  std::ofstream(root_ / "not-a-directory") << "x";
  try {
    (void)MegatronGptIndex::open(*dataset_, range_, config_, (root_ / "not-a-directory").string());
    FAIL() << "a file as --data-cache-path was accepted";
  } catch (const data::DatasetError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("--data-cache-path: cannot create the directory"), std::string::npos) << text;
    EXPECT_NE(text.find("fix:"), std::string::npos) << text;
  }
}

// Eight threads open the index at once: one builds (under the lock), seven load its file.
TEST_F(MegatronIndexCache, ConcurrentOpenersBuildOnce) {
  const MegatronGptIndex in_memory(*dataset_, range_, config_);
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<const MegatronGptIndex>> opened(kThreads);
  ::testing::internal::CaptureStderr();
  {
    std::vector<std::jthread> threads;
    for (int thread = 0; thread < kThreads; ++thread) {
      threads.emplace_back([&, thread] { opened[static_cast<std::size_t>(thread)] = open_cached(); });
    }
  }
  (void)::testing::internal::GetCapturedStderr();
  const auto built = std::ranges::count_if(opened, [](const auto& index) {
    return index->origin() == IndexOrigin::built_and_cached;
  });
  EXPECT_EQ(built, 1);
  for (const auto& index : opened) expect_same_indices(in_memory, *index);
  // Only the index and its lock file: no temporary file left behind.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(cache_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names.size(), 2u) << nlohmann::json(names).dump();
}

// Four processes (as ranks of one job) start at once on an empty cache: one says it built the
// file, three that they loaded it, and all print the samples `tandem data samples` prints
// without a cache.
TEST_F(MegatronIndexCache, ConcurrentProcessesShareOneFile) {
  const std::string arguments = " data samples --data-path " + testing::shell_quoted((root_ / "docs").string()) +
                                " --data-order megatron --seq-length 7 --train-samples 250 "
                                "--global-batch-size 2 --micro-batch-size 1";
  const auto plain = testing::run_shell(testing::shell_quoted(TANDEM_BINARY) + arguments + " 2>/dev/null");
  ASSERT_EQ(plain.exit_code, 0);
  ASSERT_EQ(std::count(plain.output.begin(), plain.output.end(), '\n'), 320);  // every sample
  std::string script;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string out = testing::shell_quoted((root_ / ("rank" + std::to_string(rank))).string());
    script += testing::shell_quoted(TANDEM_BINARY) + arguments + " --data-cache-path " +
              testing::shell_quoted(cache_.string()) + " >" + out + ".out 2>" + out + ".err & ";
  }
  ASSERT_EQ(testing::run_shell(script + "wait").exit_code, 0);
  int built = 0;
  int loaded = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const auto read = [&](const char* extension) {
      std::ifstream in(root_ / ("rank" + std::to_string(rank) + extension));
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(read(".out"), plain.output) << "rank " << rank;
    const std::string said = read(".err");
    built += said.find("built and cached in") != std::string::npos ? 1 : 0;
    loaded += said.find("loaded from") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(built, 1);
  EXPECT_EQ(loaded, 3);
}

}  // namespace
}  // namespace tandem
