// JSON Lines -> byte tokens -> indexed dataset, and the embedded corpus (see jsonl_builder.hpp).
#include "core/data/jsonl_builder.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <span>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/data/text_tokenizer.hpp"

#ifndef TANDEM_SOURCE_DIR
#error "core/CMakeLists.txt defines TANDEM_SOURCE_DIR for the embedded corpus"
#endif

namespace tandem::data {

namespace {
constexpr const char* kCorpusRelativePath = "fixtures/corpus/default.jsonl";
constexpr const char* kCorpusEnvironment = "TANDEM_CORPUS";
}  // namespace

std::vector<std::int32_t> byte_tokenize(const std::string& utf8_text) {
  std::vector<std::int32_t> tokens(utf8_text.size());  // [bytes]
  for (std::size_t i = 0; i < utf8_text.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(static_cast<unsigned char>(utf8_text[i]));
  }
  return tokens;
}

namespace {

// Opens the input; throws JsonlError (line 0) when it cannot.
std::ifstream open_jsonl(const JsonlBuildConfig& config) {
  std::ifstream input(config.input_path, std::ios::binary);
  if (!input) {
    throw JsonlError("--input " + config.input_path +
                         ": cannot open; fix: give an existing JSON Lines file",
                     0);
  }
  return input;
}

// Calls `take(tokens)` for each document of `input`, in order, each piece's text tokenized by
// `tokenize`; throws JsonlError on a bad line.
template <typename Tokenize, typename Take>
void for_each_jsonl_document(const JsonlBuildConfig& config, std::ifstream& input, Tokenize&& tokenize, Take&& take) {
  std::string line;
  std::int64_t line_number = 0;
  while (std::getline(input, line)) {
    ++line_number;
    const std::string where = config.input_path + ":" + std::to_string(line_number) + ": ";
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      throw JsonlError(where + "empty line; expected one JSON object per line with a \"" +
                           config.text_key + "\" string; fix: remove the blank line",
                       line_number);
    }
    nlohmann::json document;
    try {
      document = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      throw JsonlError(where + "not valid JSON (" + error.what() +
                           "); fix: write one JSON object per line",
                       line_number);
    }
    if (!document.is_object()) {
      throw JsonlError(where + "a JSON " + std::string(document.type_name()) +
                           "; expected an object with a \"" + config.text_key +
                           "\" string; fix: write {\"" + config.text_key + "\": \"...\"}",
                       line_number);
    }
    const auto text = document.find(config.text_key);
    if (text == document.end()) {
      throw JsonlError(where + "no \"" + config.text_key +
                           "\" field; expected an object with a \"" + config.text_key +
                           "\" string; fix: add the field",
                       line_number);
    }
    JsonlDocument pieces;
    if (text->is_string()) {
      pieces.push_back(tokenize(text->get_ref<const std::string&>()));
    } else if (text->is_array()) {
      // Megatron's preprocess_data.py: a list's elements are tokenized one by one (its sentences).
      for (std::size_t i = 0; i < text->size(); ++i) {
        const auto& piece = (*text)[i];
        if (!piece.is_string()) {
          throw JsonlError(where + "\"" + config.text_key + "\"[" + std::to_string(i) + "] is a " +
                               std::string(piece.type_name()) +
                               "; expected a string (a list-valued text holds strings); fix: store "
                               "each piece of the document's text as a string",
                           line_number);
        }
        pieces.push_back(tokenize(piece.get_ref<const std::string&>()));
      }
    } else {
      throw JsonlError(where + "\"" + config.text_key + "\" is a " +
                           std::string(text->type_name()) +
                           "; expected a string or a list of strings; fix: store the document's "
                           "text as a string",
                       line_number);
    }
    take(std::move(pieces));
  }
  if (input.bad()) {
    throw JsonlError("--input " + config.input_path + ": read failed after line " +
                         std::to_string(line_number),
                     line_number);
  }
}

}  // namespace

namespace {

std::vector<std::span<const std::int32_t>> spans_of(const JsonlDocument& document) {
  return {document.begin(), document.end()};
}

}  // namespace

std::vector<JsonlDocument> read_jsonl_documents(const JsonlBuildConfig& config) {
  std::vector<JsonlDocument> documents;
  auto input = open_jsonl(config);
  for_each_jsonl_document(config, input, byte_tokenize,
                          [&](JsonlDocument pieces) { documents.push_back(std::move(pieces)); });
  return documents;
}

IndexedDatasetSummary write_documents(const std::string& prefix, const std::vector<JsonlDocument>& documents) {
  IndexedDatasetWriterConfig writer_config;
  writer_config.prefix = prefix;
  writer_config.vocab_size = kByteVocabularySize;
  writer_config.eod_token = kEodToken;
  IndexedDatasetWriter writer(writer_config);  // removes its temporaries if we throw
  for (const auto& document : documents) writer.add_document_pieces(spans_of(document));
  return writer.finish();
}

IndexedDatasetSummary build_dataset_from_jsonl(const JsonlBuildConfig& config) {
  // Documents stream into the writer's temporary files; a bad line throws before finish(), and
  // the writer's destructor removes the temporaries, so no output file is left behind.
  const std::unique_ptr<TextTokenizer> tokenizer = make_text_tokenizer(config.tokenizer);  // ConfigError
  IndexedDatasetWriterConfig writer_config;
  writer_config.prefix = config.output_prefix;
  // preprocess_data.py: DType.optimal_dtype(tokenizer.vocab_size), the size before padding.
  writer_config.vocab_size = tokenizer->ids().vocab_size;
  writer_config.eod_token = tokenizer->ids().eod_token;
  auto input = open_jsonl(config);
  const auto directory = std::filesystem::path(config.output_prefix).parent_path();
  if (!directory.empty() && !std::filesystem::is_directory(directory)) {
    throw JsonlError("--output-prefix " + config.output_prefix + ": directory " +
                         directory.string() + " does not exist; fix: create it first",
                     0);
  }
  IndexedDatasetWriter writer(writer_config);
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto last_report = started;
  std::int64_t documents = 0;
  std::int64_t tokens = 0;
  const auto report = [&](const char* what) {
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    const double rate_base = seconds > 0 ? seconds : 1e-9;
    std::cerr << "data build: " << what << documents << " documents, " << tokens << " tokens in " << seconds
              << " s (" << static_cast<std::int64_t>(static_cast<double>(documents) / rate_base) << " documents/s, "
              << static_cast<std::int64_t>(static_cast<double>(tokens) / rate_base) << " tokens/s)\n";
  };
  const auto tokenize = [&](const std::string& text) { return tokenizer->tokenize(text); };
  for_each_jsonl_document(config, input, tokenize, [&](const JsonlDocument& pieces) {
    writer.add_document_pieces(spans_of(pieces));
    ++documents;
    bool any = false;
    for (const auto& piece : pieces) {
      tokens += static_cast<std::int64_t>(piece.size());
      any = any || !piece.empty();
    }
    if (any) ++tokens;  // the EOD the writer appends
    if (config.progress_seconds >= 0) {
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - last_report).count() >= config.progress_seconds) {
        last_report = now;
        report("");
      }
    }
  });
  IndexedDatasetSummary summary = writer.finish();
  if (config.progress_seconds >= 0 &&
      std::chrono::duration<double>(Clock::now() - started).count() >= config.progress_seconds) {
    report("done, ");
  }
  return summary;
}

std::string default_corpus_jsonl_path() {
  std::vector<std::filesystem::path> tried;
  if (const char* from_environment = std::getenv(kCorpusEnvironment)) {
    const std::filesystem::path path(from_environment);
    if (std::filesystem::is_regular_file(path)) return path.string();
    tried.push_back(path);
  }
  const auto compiled = std::filesystem::path(TANDEM_SOURCE_DIR) / kCorpusRelativePath;
  if (std::filesystem::is_regular_file(compiled)) return compiled.string();
  tried.push_back(compiled);
  std::error_code error;
  const auto executable = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    for (auto directory = executable.parent_path(); !directory.empty();
         directory = directory.parent_path()) {
      const auto candidate = directory / kCorpusRelativePath;
      if (std::filesystem::is_regular_file(candidate)) return candidate.string();
      tried.push_back(candidate);
      if (directory == directory.root_path()) break;
    }
  }
  std::string message = "the embedded corpus " + std::string(kCorpusRelativePath) +
                        " was not found; tried:";
  for (const auto& path : tried) message += " " + path.string();
  message += "; fix: set " + std::string(kCorpusEnvironment) +
             "=/path/to/default.jsonl or give --data-path PREFIX";
  throw DatasetError(message);
}

namespace {
// Whether PREFIX already holds exactly these documents as the writer would record them.
bool dataset_holds(const std::string& prefix, const std::vector<JsonlDocument>& documents) {
  try {
    const auto dataset = IndexedDataset::open(prefix, dtype_for_vocabulary(kByteVocabularySize));
    if (dataset.document_count() != static_cast<std::int64_t>(documents.size())) return false;
    std::int64_t sequence = 0;
    for (std::size_t d = 0; d < documents.size(); ++d) {
      // The sequences the writer records: the non-empty pieces, the EOD after the last.
      std::vector<std::vector<std::int32_t>> expected;
      for (const auto& piece : documents[d]) {
        if (!piece.empty()) expected.push_back(piece);
      }
      if (!expected.empty()) expected.back().push_back(kEodToken);
      const std::int64_t first = dataset.document_index(static_cast<std::int64_t>(d));
      const std::int64_t last = dataset.document_index(static_cast<std::int64_t>(d) + 1);
      if (first != sequence || last != sequence + static_cast<std::int64_t>(expected.size())) return false;
      for (const auto& tokens : expected) {
        if (dataset.sequence_tokens(sequence++) != tokens) return false;
      }
    }
    return true;
  } catch (const DatasetError&) {
    return false;
  }
}
}  // namespace

std::string build_default_corpus_dataset(const std::string& directory) {
  std::filesystem::create_directories(directory);
  JsonlBuildConfig config;
  config.input_path = default_corpus_jsonl_path();
  config.output_prefix = (std::filesystem::path(directory) / "default_corpus").string();
  const auto documents = read_jsonl_documents(config);
  if (!dataset_holds(config.output_prefix, documents)) {
    write_documents(config.output_prefix, documents);
  }
  return config.output_prefix;
}

}  // namespace tandem::data
