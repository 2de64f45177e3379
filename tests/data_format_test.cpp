// The on-disk dataset (SPEC 2) and `tandem data build` (SPEC 12): round trips, a byte-exact .idx
// written by hand from the SPEC layout, every refused input with its error, atomic writes,
// --split arithmetic, the embedded corpus, and the real binary end to end. Comparisons are exact.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/args.hpp"
#include "core/data/indexed_dataset.hpp"
#include "core/data/jsonl_builder.hpp"
#include "core/data/split.hpp"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_data_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(Bytes& out, T value) {
  unsigned char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.insert(out.end(), raw, raw + sizeof(T));
}

// The .idx of SPEC 2, field by field, from its parts.
Bytes make_idx(std::uint8_t dtype_code, const std::vector<std::int32_t>& lengths,
               const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& documents,
               std::uint64_t version = 1) {
  Bytes out = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put<std::uint64_t>(out, version);
  put<std::uint8_t>(out, dtype_code);
  put<std::uint64_t>(out, lengths.size());
  put<std::uint64_t>(out, documents.size());
  for (auto length : lengths) put<std::int32_t>(out, length);
  for (auto offset : offsets) put<std::int64_t>(out, offset);
  for (auto document : documents) put<std::int64_t>(out, document);
  return out;
}

Bytes make_bin_u16(const std::vector<std::uint16_t>& tokens) {
  Bytes out;
  for (auto token : tokens) put<std::uint16_t>(out, token);
  return out;
}

JsonlBuildConfig jsonl_config(const std::string& input, const std::string& prefix) {
  JsonlBuildConfig config;
  config.input_path = input;
  config.output_prefix = prefix;
  return config;
}

IndexedDatasetWriterConfig writer_config(const std::string& prefix) {
  IndexedDatasetWriterConfig config;
  config.prefix = prefix;
  return config;
}

IndexedDatasetSummary write_dataset(const std::string& prefix,
                                    const std::vector<std::vector<std::int32_t>>& documents,
                                    std::int64_t vocab_size = kByteVocabularySize) {
  IndexedDatasetWriterConfig config;
  config.prefix = prefix;
  config.vocab_size = vocab_size;
  IndexedDatasetWriter writer(config);
  for (const auto& document : documents) writer.add_document(document);
  return writer.finish();
}

// Expects opening PREFIX to throw DatasetError whose message holds every one of `parts`.
void expect_refused(const std::string& prefix, const std::vector<std::string>& parts,
                    std::optional<TokenDtype> expected = std::nullopt) {
  try {
    IndexedDataset::open(prefix, expected);
    ADD_FAILURE() << "opened " << prefix << " but expected an error holding " << parts.front();
  } catch (const DatasetError& error) {
    const std::string message = error.what();
    for (const auto& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "error message lacks \"" << part << "\": " << message;
    }
  }
}

// ---- Round trip and byte layout ---------------------------------------------------------------

TEST(IndexedDataset, RoundTripKeepsTokensDocumentsAndEmptyDocuments) {
  TempDir dir;
  const std::vector<std::vector<std::int32_t>> documents = {{72, 105}, {}, {0, 255, 7}, {1}};
  const auto summary = write_dataset(dir / "ds", documents);
  EXPECT_EQ(summary.documents, 4);
  EXPECT_EQ(summary.empty_documents, 1);
  EXPECT_EQ(summary.sequences, 3);
  EXPECT_EQ(summary.tokens, (2 + 1) + (3 + 1) + (1 + 1));  // each non-empty document + EOD
  EXPECT_EQ(summary.dtype, TokenDtype::uint16);

  const auto dataset = IndexedDataset::open(dir / "ds");
  EXPECT_EQ(dataset.dtype(), TokenDtype::uint16);
  ASSERT_EQ(dataset.sequence_count(), 3);
  ASSERT_EQ(dataset.document_count(), 4);
  EXPECT_EQ(dataset.total_tokens(), summary.tokens);
  EXPECT_EQ(dataset.sequence_tokens(0), (std::vector<std::int32_t>{72, 105, kEodToken}));
  EXPECT_EQ(dataset.sequence_tokens(1), (std::vector<std::int32_t>{0, 255, 7, kEodToken}));
  EXPECT_EQ(dataset.sequence_tokens(2), (std::vector<std::int32_t>{1, kEodToken}));
  // The empty document repeats the index before it, as Megatron's add_document([], []) does.
  const std::vector<std::int64_t> expected_documents = {0, 1, 1, 2, 3};
  for (std::int64_t j = 0; j <= dataset.document_count(); ++j) {
    EXPECT_EQ(dataset.document_index(j), expected_documents[static_cast<std::size_t>(j)]) << j;
  }
  std::vector<std::int32_t> middle(2);  // [2]
  dataset.read_tokens(1, 1, middle);
  EXPECT_EQ(middle, (std::vector<std::int32_t>{255, 7}));
  EXPECT_THROW(dataset.read_tokens(1, 3, middle), DatasetError);  // past the sequence
}

TEST(IndexedDataset, IdxIsByteExactAgainstTheSpecLayout) {
  TempDir dir;
  write_dataset(dir / "ds", {{97, 98}, {}, {1, 2, 3}});
  // SPEC 2 by hand: magic, version 1, dtype 8 (uint16: vocab 258 < 65,500), N = 2, D+1 = 4,
  // lengths {2+1, 3+1}, byte offsets {0, 3 tokens x 2 bytes}, document indices {0, 1, 1, 2}.
  const Bytes expected_idx = make_idx(8, {3, 4}, {0, 3 * 2}, {0, 1, 1, 2});
  EXPECT_EQ(read_file(dir / "ds.idx"), expected_idx);
  EXPECT_EQ(read_file(dir / "ds.bin"), make_bin_u16({97, 98, 256, 1, 2, 3, 256}));
  EXPECT_EQ(expected_idx.size(), kIndexHeaderBytes + 2 * (4 + 8) + 4 * 8);
}

TEST(IndexedDataset, LargeVocabularyWritesInt32AsMegatron) {
  TempDir dir;
  constexpr std::int64_t kLargeVocabulary = 65500;  // first size Megatron stores as int32
  EXPECT_EQ(dtype_for_vocabulary(kLargeVocabulary - 1), TokenDtype::uint16);
  EXPECT_EQ(dtype_for_vocabulary(kLargeVocabulary), TokenDtype::int32);
  const auto summary = write_dataset(dir / "ds", {{65000, 1}}, kLargeVocabulary);
  EXPECT_EQ(summary.dtype, TokenDtype::int32);
  EXPECT_EQ(read_file(dir / "ds.bin").size(), 3u * 4u);  // 2 tokens + EOD, 4 bytes each
  const auto dataset = IndexedDataset::open(dir / "ds", TokenDtype::int32);
  EXPECT_EQ(dataset.sequence_tokens(0), (std::vector<std::int32_t>{65000, 1, kEodToken}));
}

TEST(IndexedDataset, EmptyDatasetOpens) {
  TempDir dir;
  write_dataset(dir / "ds", {{}, {}});
  const auto dataset = IndexedDataset::open(dir / "ds");
  EXPECT_EQ(dataset.sequence_count(), 0);
  EXPECT_EQ(dataset.document_count(), 2);
  EXPECT_EQ(read_file(dir / "ds.bin").size(), 0u);
}

// ---- Refused input ----------------------------------------------------------------------------

// A valid two-sequence dataset the cases below break one field at a time.
struct HandMade {
  std::vector<std::int32_t> lengths{3, 2};
  std::vector<std::int64_t> offsets{0, 6};
  std::vector<std::int64_t> documents{0, 1, 2};
  std::uint8_t dtype = 8;
  std::uint64_t version = 1;
  std::vector<std::uint16_t> tokens{10, 11, 256, 12, 256};

  void write(const TempDir& dir) const {
    write_file(dir / "ds.idx", make_idx(dtype, lengths, offsets, documents, version));
    write_file(dir / "ds.bin", make_bin_u16(tokens));
  }
};

// `made` written out must be refused with an error naming every one of `parts`.
void expect_hand_made_refused(const HandMade& made, const std::vector<std::string>& parts) {
  TempDir dir;
  made.write(dir);
  expect_refused(dir / "ds", parts);
}

// The valid hand-made dataset with its .idx bytes changed by `edit` must be refused with an error
// naming every one of `parts`.
void expect_edited_idx_refused(const std::function<void(Bytes&)>& edit, const std::vector<std::string>& parts) {
  TempDir dir;
  HandMade{}.write(dir);
  auto idx = read_file(dir / "ds.idx");
  edit(idx);
  write_file(dir / "ds.idx", idx);
  expect_refused(dir / "ds", parts);
}

TEST(IndexedDatasetRefuses, NothingWhenTheHandMadeDatasetIsValid) {
  TempDir dir;
  HandMade{}.write(dir);
  const auto dataset = IndexedDataset::open(dir / "ds");  // the negative control: it loads
  EXPECT_EQ(dataset.sequence_tokens(1), (std::vector<std::int32_t>{12, kEodToken}));
}

TEST(IndexedDatasetRefuses, TruncatedHeader) {
  expect_edited_idx_refused([](Bytes& idx) { idx.resize(20); }, {"ds.idx", "file size", "20 bytes", "truncated"});
}

TEST(IndexedDatasetRefuses, TruncatedBody) {
  // Drop the last document index.
  expect_edited_idx_refused([](Bytes& idx) { idx.resize(idx.size() - 8); },
                            {"ds.idx", "document-index count D+1", "3", "truncated"});
}

TEST(IndexedDatasetRefuses, TrailingBytes) {
  expect_edited_idx_refused([](Bytes& idx) { idx.push_back(0); }, {"ds.idx", "file size", "trailing bytes"});
}

TEST(IndexedDatasetRefuses, WrongMagic) {
  expect_edited_idx_refused([](Bytes& idx) { idx[0] = 'X'; }, {"ds.idx", "magic", "MMIDIDX"});
}

TEST(IndexedDatasetRefuses, WrongVersion) {
  HandMade made;
  made.version = 2;
  expect_hand_made_refused(made, {"ds.idx", "version = 2", "expected 1"});
}

TEST(IndexedDatasetRefuses, UnknownDtypeCode) {
  HandMade made;
  made.dtype = 9;
  expect_hand_made_refused(made, {"ds.idx", "dtype code = 9", "1..8"});
}

TEST(IndexedDatasetRefuses, FloatDtype) {
  HandMade made;
  made.dtype = 7;
  expect_hand_made_refused(made, {"ds.idx", "dtype code = 7 (float32)", "integer"});
}

TEST(IndexedDatasetRefuses, DtypeMismatchWithTheExpectedDtype) {
  TempDir dir;
  HandMade{}.write(dir);
  expect_refused(dir / "ds", {"ds.idx", "dtype code = 8 (uint16)", "4 (int32)", "dtype mismatch"},
                 TokenDtype::int32);
}

TEST(IndexedDatasetRefuses, DtypeMismatchWithTheBinSize) {
  HandMade made;
  made.dtype = 4;                // the header claims int32 ...
  made.offsets = {0, 3 * 4};     // ... consistently within .idx ...
  made.tokens.push_back(0);      // ... but .bin holds 6 uint16 tokens = 12 bytes, not 20
  expect_hand_made_refused(made, {"ds.idx", "past the end of .bin"});
}

TEST(IndexedDatasetRefuses, BinLongerThanTheIndexDescribes) {
  HandMade made;
  made.tokens.push_back(5);  // one extra uint16 token
  expect_hand_made_refused(made, {"ds.bin", "file size", "12 bytes", "10 bytes", "dtype mismatch"});
}

TEST(IndexedDatasetRefuses, LengthPastTheEndOfBin) {
  HandMade made;
  made.lengths = {3, 9};
  expect_hand_made_refused(made, {"ds.idx", "offsets[1] + lengths[1]", "24 bytes", "past the end"});
}

TEST(IndexedDatasetRefuses, NonContiguousOffset) {
  HandMade made;
  made.offsets = {0, 4};
  expect_hand_made_refused(made, {"ds.idx", "offsets[1] = 4", "expected 6"});
}

TEST(IndexedDatasetRefuses, DocumentIndexPastTheEnd) {
  HandMade made;
  made.documents = {0, 1, 3};
  expect_hand_made_refused(made, {"ds.idx", "document indices[2] = 3", "past the end"});
}

TEST(IndexedDatasetRefuses, NonMonotonicDocumentIndices) {
  HandMade made;
  made.documents = {0, 2, 1, 2};
  expect_hand_made_refused(made, {"ds.idx", "document indices[2] = 1", "non-monotonic"});
}

TEST(IndexedDatasetRefuses, DocumentsNotCoveringEverySequence) {
  HandMade made;
  made.documents = {0, 1};
  expect_hand_made_refused(made, {"ds.idx", "document indices[1] = 1", "N = 2"});
}

TEST(IndexedDatasetRefuses, MissingFile) {
  TempDir dir;
  expect_refused(dir / "absent", {"absent.idx", "cannot open"});
}

// ---- Atomic writes ----------------------------------------------------------------------------

TEST(IndexedDatasetWriter, FailedWriteKeepsTheOldDatasetAndLeavesNoTemporaries) {
  TempDir dir;
  write_dataset(dir / "ds", {{1, 2, 3}});
  const auto old_idx = read_file(dir / "ds.idx");
  const auto old_bin = read_file(dir / "ds.bin");
  EXPECT_THROW(write_dataset(dir / "ds", {{4}, {kByteVocabularySize}}), DatasetError);
  EXPECT_EQ(read_file(dir / "ds.idx"), old_idx);
  EXPECT_EQ(read_file(dir / "ds.bin"), old_bin);
  EXPECT_EQ(dir.files().size(), 2u) << "temporaries left behind";
}

TEST(IndexedDatasetWriter, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    IndexedDatasetWriter writer(writer_config(dir / "ds"));
    writer.add_document(std::vector<std::int32_t>{1, 2});
  }
  EXPECT_TRUE(dir.files().empty());
}

TEST(IndexedDatasetWriter, RefusesAMissingDirectory) {
  TempDir dir;
  EXPECT_THROW({ IndexedDatasetWriter writer(writer_config(dir / "no/such/ds")); }, DatasetError);
}

// ---- --split ----------------------------------------------------------------------------------

TEST(Split, NoSplitTrainsEverything) {
  EXPECT_EQ(split_range("", 10, DatasetSplit::train), (SequenceRange{0, 10}));
  EXPECT_EQ(split_range("", 10, DatasetSplit::valid).size(), 0);
}

TEST(Split, MegatronDefaultOnAThousandSequences) {
  EXPECT_EQ(split_range("969,30,1", 1000, DatasetSplit::train), (SequenceRange{0, 969}));
  EXPECT_EQ(split_range("969,30,1", 1000, DatasetSplit::valid), (SequenceRange{969, 999}));
  EXPECT_EQ(split_range("969,30,1", 1000, DatasetSplit::test), (SequenceRange{999, 1000}));
}

TEST(Split, BookendsRoundHalfToEvenAsPython) {
  // 1,1 on 5 sequences: the book-end 0.5 x 5 = 2.5 rounds to 2 (Python's round), on 7: 3.5 -> 4.
  EXPECT_EQ(split_range("1,1", 5, DatasetSplit::train), (SequenceRange{0, 2}));
  EXPECT_EQ(split_range("1,1", 5, DatasetSplit::valid), (SequenceRange{2, 5}));
  EXPECT_EQ(split_range("1,1", 7, DatasetSplit::train), (SequenceRange{0, 4}));
  // Missing weights are 0, and a zero-weight split is empty.
  EXPECT_EQ(split_range("3", 7, DatasetSplit::train), (SequenceRange{0, 7}));
  EXPECT_EQ(split_range("3", 7, DatasetSplit::test).size(), 0);
  // Fractions normalize like counts.
  EXPECT_EQ(split_range("0.8,0.2", 10, DatasetSplit::train), (SequenceRange{0, 8}));
}

TEST(Split, RefusesBadWeights) {
  for (const std::string bad : {"a,b", "-1,2", "0,0,0", "1,2,3,4", "1,,2"}) {
    try {
      parse_split_weights(bad);
      ADD_FAILURE() << "--split " << bad << " was accepted";
    } catch (const ConfigError& error) {
      ASSERT_EQ(error.issues().size(), 1u);
      EXPECT_EQ(error.issues()[0].field, "--split");
      EXPECT_EQ(error.issues()[0].value, bad);
    }
  }
}

// ---- JSON Lines and the embedded corpus -------------------------------------------------------

TEST(Jsonl, ByteTokenizerIsUtf8Bytes) {
  EXPECT_EQ(byte_tokenize("A\xC3\xA9"), (std::vector<std::int32_t>{65, 0xC3, 0xA9}));  // "Aé"
}

TEST(Jsonl, BuildsDocumentsWithEscapesAndEmptyText) {
  TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    out << R"({"text": "hi\n", "id": 3})" << "\n" << R"({"text": ""})" << "\n"
        << R"({"text": "\u00e9"})" << "\n";
  }
  const auto summaries = build_dataset_from_jsonl(jsonl_config(dir / "docs.jsonl", dir / "ds"));
  ASSERT_EQ(summaries.size(), 1u);
  EXPECT_EQ(summaries[0].documents, 3);
  EXPECT_EQ(summaries[0].empty_documents, 1);
  const auto dataset = IndexedDataset::open(dir / "ds_text_document");
  EXPECT_EQ(dataset.sequence_tokens(0), (std::vector<std::int32_t>{'h', 'i', '\n', kEodToken}));
  EXPECT_EQ(dataset.sequence_tokens(1), (std::vector<std::int32_t>{0xC3, 0xA9, kEodToken}));
}

// A list-valued "text" is read as Megatron's tools/preprocess_data.py reads it (it was refused):
// each element is tokenized alone and each non-empty one is a sequence of the document, the EOD
// after the last; a list with nothing in it is an empty document.
TEST(Jsonl, AListValuedTextIsOneDocumentOfSequencesAsInMegatron) {
  TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    out << R"({"text": ["ab", "", "c"]})" << "\n" << R"({"text": []})" << "\n" << R"({"text": ["", ""]})" << "\n"
        << R"({"text": "d"})" << "\n";
  }
  const auto summary = build_dataset_from_jsonl(jsonl_config(dir / "docs.jsonl", dir / "ds")).at(0);
  EXPECT_EQ(summary.documents, 4);
  EXPECT_EQ(summary.empty_documents, 2);
  EXPECT_EQ(summary.sequences, 3);
  EXPECT_EQ(summary.tokens, 2 + (1 + 1) + (1 + 1));  // "ab", "c" + EOD, "d" + EOD
  const auto dataset = IndexedDataset::open(dir / "ds_text_document");
  EXPECT_EQ(dataset.sequence_tokens(0), (std::vector<std::int32_t>{'a', 'b'}));  // no EOD inside
  EXPECT_EQ(dataset.sequence_tokens(1), (std::vector<std::int32_t>{'c', kEodToken}));
  EXPECT_EQ(dataset.sequence_tokens(2), (std::vector<std::int32_t>{'d', kEodToken}));
  // Document indices [0, 2, 2, 2, 3]: the first document holds sequences 0 and 1.
  const std::vector<std::int64_t> expected_indices{0, 2, 2, 2, 3};
  for (std::size_t d = 0; d < expected_indices.size(); ++d) {
    EXPECT_EQ(dataset.document_index(static_cast<std::int64_t>(d)), expected_indices[d]) << "document index " << d;
  }
  // The embedded-corpus path writes the same bytes as the streaming build.
  const auto documents = read_jsonl_documents(jsonl_config(dir / "docs.jsonl", dir / "unused"));
  write_documents(dir / "written", documents);
  EXPECT_EQ(read_file(dir / "written.idx"), read_file(dir / "ds_text_document.idx"));
  EXPECT_EQ(read_file(dir / "written.bin"), read_file(dir / "ds_text_document.bin"));
}

TEST(Jsonl, BadLinesNameTheLineAndWriteNothing) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"text\": 5}", "is a number"},
      {"{\"text\": [\"a\", 5]}", "\"text\"[1] is a number; expected a string"},
      {"{\"text\": {\"a\": \"b\"}}", "is a object; expected a string or a list of strings"},
      {"{\"body\": \"x\"}", "no \"text\" field"},
      {"[1, 2]", "a JSON array"},
      {"{\"text\": \"unterminated}", "not valid JSON"},
      {"", "empty line"},
  };
  for (const auto& [line, reason] : cases) {
    TempDir dir;
    {
      std::ofstream out(dir / "docs.jsonl");
      out << R"({"text": "fine"})" << "\n" << line << "\n" << R"({"text": "fine"})" << "\n";
    }
    try {
      build_dataset_from_jsonl(jsonl_config(dir / "docs.jsonl", dir / "ds"));
      ADD_FAILURE() << "accepted line " << line;
    } catch (const JsonlError& error) {
      EXPECT_EQ(error.line(), 2) << line;
      const std::string message = error.what();
      EXPECT_NE(message.find("docs.jsonl:2:"), std::string::npos) << message;
      EXPECT_NE(message.find(reason), std::string::npos) << message;
    }
    EXPECT_EQ(dir.files(), std::vector<std::string>{"docs.jsonl"}) << "output left for " << line;
  }
}

// Megatron's preprocess_data.py --json-keys K1 K2: one pass over the input, one dataset per key
// under P_K_document (it wrote P.bin / P.idx, and refused a second key). Each key's dataset holds
// every line's document for that key, empty ones included, and equals a build of that key alone.
TEST(Jsonl, EveryJsonKeyIsItsOwnDatasetUnderPreprocessDataPyNames) {
  TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    out << R"({"text": "body one", "title": "T1"})" << "\n"
        << R"({"title": "", "text": "body two"})" << "\n"
        << R"({"text": ["p", "q"], "title": "T3", "id": 7})" << "\n";
  }
  auto config = jsonl_config(dir / "docs.jsonl", dir / "corpus");
  config.json_keys = {"text", "title"};
  const auto summaries = build_dataset_from_jsonl(config);
  ASSERT_EQ(summaries.size(), 2u);
  EXPECT_EQ(summaries[0].bin_path, dir / "corpus_text_document.bin");
  EXPECT_EQ(summaries[1].idx_path, dir / "corpus_title_document.idx");
  EXPECT_EQ(megatron_document_prefix(dir / "corpus", "title"), dir / "corpus_title_document");
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"corpus_text_document.bin", "corpus_text_document.idx",
                                                   "corpus_title_document.bin", "corpus_title_document.idx",
                                                   "docs.jsonl"}));
  const auto text = IndexedDataset::open(dir / "corpus_text_document");
  EXPECT_EQ(text.document_count(), 3);
  EXPECT_EQ(text.sequence_count(), 4);  // "body one", "body two", "p", "q"
  EXPECT_EQ(text.sequence_tokens(2), (std::vector<std::int32_t>{'p'}));
  const auto title = IndexedDataset::open(dir / "corpus_title_document");
  EXPECT_EQ(title.document_count(), 3);
  EXPECT_EQ(summaries[1].empty_documents, 1);
  EXPECT_EQ(title.sequence_tokens(0), (std::vector<std::int32_t>{'T', '1', kEodToken}));
  EXPECT_EQ(title.sequence_tokens(1), (std::vector<std::int32_t>{'T', '3', kEodToken}));
  // The same bytes as building each key alone.
  for (const std::string key : {"text", "title"}) {
    auto alone = jsonl_config(dir / "docs.jsonl", dir / ("alone_" + key));
    alone.json_keys = {key};
    build_dataset_from_jsonl(alone);
    for (const char* suffix : {".bin", ".idx"}) {
      EXPECT_EQ(read_file(dir / ("alone_" + key + "_" + key + "_document" + suffix)),
                read_file(dir / ("corpus_" + key + "_document" + suffix)))
          << key << suffix;
    }
  }
}

TEST(Jsonl, KeyListsThatCannotNameTheirDatasetsAreRefusedAndWriteNothing) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "--json-keys = (none): no key names a text field"},
      {{"text", ""}, "--json-keys = \"\": an empty key names no field"},
      {{"a/b"}, "--json-keys = a/b: a key with '/'"},
      {{"text", "title", "text"}, "--json-keys = text (twice): each key writes its own dataset"},
  };
  for (const auto& [keys, message] : cases) {
    TempDir dir;
    std::ofstream(dir / "docs.jsonl") << R"({"text": "a", "title": "b", "a/b": "c"})" << "\n";
    auto config = jsonl_config(dir / "docs.jsonl", dir / "ds");
    config.json_keys = keys;
    try {
      build_dataset_from_jsonl(config);
      ADD_FAILURE() << "accepted " << keys.size() << " keys";
    } catch (const JsonlError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("fix: "), std::string::npos) << error.what();
    }
    EXPECT_EQ(dir.files(), std::vector<std::string>{"docs.jsonl"});
  }
}

// A line without the second key stops the build there, and neither key's dataset is written (an
// earlier build under those names stays as it was).
TEST(Jsonl, ALineMissingOneKeyNamesItAndLeavesEveryKeysDatasetAsItWas) {
  TempDir dir;
  std::ofstream(dir / "good.jsonl") << R"({"text": "old", "title": "old"})" << "\n";
  auto config = jsonl_config(dir / "good.jsonl", dir / "ds");
  config.json_keys = {"text", "title"};
  build_dataset_from_jsonl(config);
  const auto before = read_file(dir / "ds_text_document.bin");
  std::ofstream(dir / "bad.jsonl") << R"({"text": "new", "title": "new"})" << "\n" << R"({"text": "x"})" << "\n";
  config.input_path = dir / "bad.jsonl";
  try {
    build_dataset_from_jsonl(config);
    ADD_FAILURE() << "accepted a line without \"title\"";
  } catch (const JsonlError& error) {
    EXPECT_EQ(error.line(), 2);
    EXPECT_NE(std::string(error.what()).find("bad.jsonl:2: no \"title\" field"), std::string::npos) << error.what();
  }
  EXPECT_EQ(read_file(dir / "ds_text_document.bin"), before);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"bad.jsonl", "ds_text_document.bin", "ds_text_document.idx",
                                                   "ds_title_document.bin", "ds_title_document.idx", "good.jsonl"}));
}

TEST(DefaultCorpus, IsFoundSmallVariedAndBuilds) {
  const std::string path = default_corpus_jsonl_path();
  EXPECT_TRUE(fs::is_regular_file(path));
  constexpr std::uintmax_t kGitFriendlyBytes = 1 << 20;  // "well under 1 MB"
  EXPECT_LT(fs::file_size(path), kGitFriendlyBytes);

  TempDir dir;
  const std::string prefix = build_default_corpus_dataset(dir / "cache");
  const auto dataset = IndexedDataset::open(prefix, TokenDtype::uint16);
  EXPECT_GE(dataset.document_count(), 200);
  constexpr std::int32_t kDefaultWindow = 512;
  std::int64_t longer_than_window = 0;
  for (std::int64_t i = 0; i < dataset.sequence_count(); ++i) {
    longer_than_window += dataset.sequence_length(i) > kDefaultWindow + 1 ? 1 : 0;
  }
  EXPECT_GE(longer_than_window, 10);
  // A second call finds the same corpus and leaves the files alone.
  const auto modified = fs::last_write_time(prefix + ".idx");
  EXPECT_EQ(build_default_corpus_dataset(dir / "cache"), prefix);
  EXPECT_EQ(fs::last_write_time(prefix + ".idx"), modified);
}

// ---- The real binary --------------------------------------------------------------------------

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

CommandResult run_tandem(const std::string& arguments, const TempDir& dir) {
  const std::string command = std::string(TANDEM_BINARY) + " " + arguments + " >" +
                              (dir / "stdout.txt") + " 2>" + (dir / "stderr.txt");
  const int status = std::system(command.c_str());
  CommandResult run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto text = [](const std::string& path) {
    const auto bytes = read_file(path);
    return std::string(bytes.begin(), bytes.end());
  };
  run.out = text(dir / "stdout.txt");
  run.err = text(dir / "stderr.txt");
  fs::remove(dir / "stdout.txt");
  fs::remove(dir / "stderr.txt");
  return run;
}

TEST(DataBuildCommand, BuildsTheEmbeddedCorpusEndToEnd) {
  TempDir dir;
  const std::string corpus = std::string(TANDEM_SOURCE_DIR) + "/fixtures/corpus/default.jsonl";
  const CommandResult run = run_tandem("data build --input " + corpus + " --output-prefix " + (dir / "c"), dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("documents: "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("dtype:     uint16 (code 8)"), std::string::npos) << run.out;
  // Without --json-keys: Megatron's default key, text, and preprocess_data.py's name for it.
  EXPECT_NE(run.out.find("train with --data-path " + (dir / "c_text_document")), std::string::npos) << run.out;
  const auto dataset = IndexedDataset::open(dir / "c_text_document");
  EXPECT_NE(run.out.find("tokens:    " + std::to_string(dataset.total_tokens())), std::string::npos)
      << run.out;
  // Same bytes as the library's build of the same file.
  const auto library = build_dataset_from_jsonl(jsonl_config(corpus, dir / "lib"));
  EXPECT_EQ(read_file(dir / "c_text_document.idx"), read_file(dir / "lib_text_document.idx"));
  EXPECT_EQ(read_file(dir / "c_text_document.bin"), read_file(dir / "lib_text_document.bin"));
  EXPECT_EQ(library.at(0).tokens, dataset.total_tokens());
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"c_text_document.bin", "c_text_document.idx",
                                                   "lib_text_document.bin", "lib_text_document.idx"}));
}

// A killed `tandem data build` leaves PREFIX.bin.tmp.PID (and PREFIX.idx.tmp.PID); nothing removed
// them. The next build of PREFIX removes those whose PID is not running and that no process
// holds, and says so; a running writer's (its PID alive, or its flock held) and other prefixes'
// stay.
TEST(DataBuildCommand, TheNextBuildRemovesWhatKilledBuildsLeft) {
  TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    out << R"({"text": "a"})" << "\n";
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // a PID that no longer runs
  const std::string dead = std::to_string(child);
  const std::string alive = std::to_string(::getpid());
  const std::vector<std::string> abandoned{dir / ("ds_text_document.bin.tmp." + dead),
                                           dir / ("ds_text_document.idx.tmp." + dead)};
  const std::string running = dir / ("ds_text_document.bin.tmp." + alive);
  const std::string held = dir / ("ds_text_document.bin.tmp.1" + dead);  // a dead PID too, but locked
  const std::string other = dir / ("other.bin.tmp." + dead);
  for (const auto& path : {abandoned[0], abandoned[1], running, held, other}) std::ofstream(path) << "partial";
  const int held_fd = ::open(held.c_str(), O_RDONLY);
  ASSERT_GE(held_fd, 0);
  ASSERT_EQ(::flock(held_fd, LOCK_EX | LOCK_NB), 0);
  const bool held_pid_runs = ::kill(static_cast<pid_t>(std::stol("1" + dead)), 0) == 0;
  const CommandResult run = run_tandem("data build --input " + (dir / "docs.jsonl") + " --output-prefix " + (dir / "ds"), dir);
  ::close(held_fd);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  for (const auto& path : abandoned) {
    EXPECT_FALSE(fs::exists(path)) << path;
    EXPECT_NE(run.err.find("note: removed " + path + ", left by a dataset write that was killed"), std::string::npos)
        << run.err;
  }
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(held)) << "pid 1" << dead << (held_pid_runs ? " runs" : " does not run");
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(dir / "ds_text_document.idx"));
  EXPECT_EQ(run.err.find("removed " + running), std::string::npos) << run.err;
}

TEST(DataBuildCommand, BadLineExitsTwoWithTheLineAndLeavesNoFiles) {
  TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    out << R"({"text": "a"})" << "\n" << R"({"text": "b"})" << "\n" << R"({"txt": "c"})" << "\n";
  }
  const CommandResult run = run_tandem("data build --input " + (dir / "docs.jsonl") + " --output-prefix " +
                                 (dir / "ds"),
                             dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("docs.jsonl:3:"), std::string::npos) << run.err;
  EXPECT_EQ(dir.files(), std::vector<std::string>{"docs.jsonl"});
}

TEST(DataBuildCommand, MissingArgumentsAndUnknownTokenizerAreErrors) {
  TempDir dir;
  EXPECT_NE(run_tandem("data build --input x.jsonl", dir).exit_code, 0);
  EXPECT_NE(run_tandem("data build --input x.jsonl --output-prefix y --tokenizer gpt2", dir).exit_code,
            0);
  EXPECT_NE(run_tandem("data", dir).exit_code, 0);
  const CommandResult no_folder = run_tandem(
      "data build --input " + std::string(TANDEM_SOURCE_DIR) +
          "/fixtures/corpus/default.jsonl --output-prefix " + (dir / "absent/ds"),
      dir);
  EXPECT_EQ(no_folder.exit_code, 2);
  EXPECT_NE(no_folder.err.find("does not exist"), std::string::npos) << no_folder.err;
}

}  // namespace
}  // namespace tandem::data
