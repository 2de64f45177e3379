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

// One document's pieces from field `key` of the parsed line `document`, each tokenized by
// `tokenize`; throws JsonlError (at `where`) when the field is missing or not text.
template <typename Tokenize>
JsonlDocument document_pieces(const nlohmann::json& document, const std::string& key, const std::string& where,
                              std::int64_t line_number, Tokenize& tokenize) {
  const auto text = document.find(key);
  if (text == document.end()) {
    throw JsonlError(where + "no \"" + key + "\" field; expected an object with a \"" + key +
                         "\" string (--json-keys names it); fix: add the field, or name the fields the "
                         "lines hold with --json-keys",
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
        throw JsonlError(where + "\"" + key + "\"[" + std::to_string(i) + "] is a " +
                             std::string(piece.type_name()) +
                             "; expected a string (a list-valued text holds strings); fix: store "
                             "each piece of the document's text as a string",
                         line_number);
      }
      pieces.push_back(tokenize(piece.get_ref<const std::string&>()));
    }
  } else {
    throw JsonlError(where + "\"" + key + "\" is a " + std::string(text->type_name()) +
                         "; expected a string or a list of strings; fix: store the document's "
                         "text as a string",
                     line_number);
  }
  return pieces;
}

// Calls `take(documents)` for each line of `input`, in order, with one document per key of
// config.json_keys (in that order), each piece's text tokenized by `tokenize`; throws JsonlError
// on a bad line.
template <typename Tokenize, typename Take>
void for_each_jsonl_document(const JsonlBuildConfig& config, std::ifstream& input, Tokenize&& tokenize, Take&& take) {
  const std::string& first_key = config.json_keys.front();
  std::string line;
  std::int64_t line_number = 0;
  std::vector<JsonlDocument> documents;
  while (std::getline(input, line)) {
    ++line_number;
    const std::string where = config.input_path + ":" + std::to_string(line_number) + ": ";
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      throw JsonlError(where + "empty line; expected one JSON object per line with a \"" + first_key +
                           "\" string; fix: remove the blank line",
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
                           "; expected an object with a \"" + first_key +
                           "\" string; fix: write {\"" + first_key + "\": \"...\"}",
                       line_number);
    }
    documents.clear();
    for (const std::string& key : config.json_keys) {
      documents.push_back(document_pieces(document, key, where, line_number, tokenize));
    }
    take(documents);
  }
  if (input.bad()) {
    throw JsonlError("--input " + config.input_path + ": read failed after line " +
                         std::to_string(line_number),
                     line_number);
  }
}

// Throws JsonlError (line 0) unless every key can name a dataset of its own: at least one key,
// none empty, none holding '/' (it would become a folder of the file name), none twice.
void check_json_keys(const JsonlBuildConfig& config) {
  const auto refuse = [](const std::string& value, const std::string& rule, const std::string& fix) {
    throw JsonlError("--json-keys = " + value + ": " + rule + "; fix: " + fix, 0);
  };
  if (config.json_keys.empty()) refuse("(none)", "no key names a text field", "give at least one key, e.g. --json-keys text");
  for (std::size_t i = 0; i < config.json_keys.size(); ++i) {
    const std::string& key = config.json_keys[i];
    if (key.empty()) refuse("\"\"", "an empty key names no field", "give the field's name");
    if (key.find('/') != std::string::npos) {
      refuse(key, "a key with '/' would make " + megatron_document_prefix(config.output_prefix, key) +
                      " a path through a folder",
             "rename the field, or give its dataset's folder in --output-prefix");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (config.json_keys[j] == key) {
        refuse(key + " (twice)", "each key writes its own dataset " + megatron_document_prefix(config.output_prefix, key),
               "give each key once");
      }
    }
  }
}

}  // namespace

namespace {

std::vector<std::span<const std::int32_t>> spans_of(const JsonlDocument& document) {
  return {document.begin(), document.end()};
}

}  // namespace

std::string megatron_document_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

std::vector<JsonlDocument> read_jsonl_documents(const JsonlBuildConfig& config) {
  check_json_keys(config);
  if (config.json_keys.size() != 1) {
    throw JsonlError("--json-keys: read_jsonl_documents reads one key, not " +
                         std::to_string(config.json_keys.size()) + "; fix: use build_dataset_from_jsonl",
                     0);
  }
  std::vector<JsonlDocument> documents;
  auto input = open_jsonl(config);
  for_each_jsonl_document(config, input, byte_tokenize, [&](std::vector<JsonlDocument>& per_key) {
    documents.push_back(std::move(per_key.front()));
  });
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

std::vector<IndexedDatasetSummary> build_dataset_from_jsonl(const JsonlBuildConfig& config) {
  // Documents stream into the writers' temporary files; a bad line throws before finish(), and
  // the writers' destructors remove the temporaries, so no output file is left behind.
  check_json_keys(config);
  const std::unique_ptr<TextTokenizer> tokenizer = make_text_tokenizer(config.tokenizer);  // ConfigError
  auto input = open_jsonl(config);
  const auto directory = std::filesystem::path(config.output_prefix).parent_path();
  if (!directory.empty() && !std::filesystem::is_directory(directory)) {
    throw JsonlError("--output-prefix " + config.output_prefix + ": directory " +
                         directory.string() + " does not exist; fix: create it first",
                     0);
  }
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& key : config.json_keys) {
    IndexedDatasetWriterConfig writer_config;
    writer_config.prefix = megatron_document_prefix(config.output_prefix, key);
    // preprocess_data.py: DType.optimal_dtype(tokenizer.vocab_size), the size before padding.
    writer_config.vocab_size = tokenizer->ids().vocab_size;
    writer_config.eod_token = tokenizer->ids().eod_token;
    writers.push_back(std::make_unique<IndexedDatasetWriter>(writer_config));
  }
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto last_report = started;
  std::int64_t documents = 0;
  std::int64_t tokens = 0;  // every key's, EODs included
  const auto report = [&](const char* what) {
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    const double rate_base = seconds > 0 ? seconds : 1e-9;
    std::cerr << "data build: " << what << documents << " documents, " << tokens << " tokens in " << seconds
              << " s (" << static_cast<std::int64_t>(static_cast<double>(documents) / rate_base) << " documents/s, "
              << static_cast<std::int64_t>(static_cast<double>(tokens) / rate_base) << " tokens/s)\n";
  };
  const auto tokenize = [&](const std::string& text) { return tokenizer->tokenize(text); };
  for_each_jsonl_document(config, input, tokenize, [&](const std::vector<JsonlDocument>& per_key) {
    for (std::size_t k = 0; k < per_key.size(); ++k) {
      writers[k]->add_document_pieces(spans_of(per_key[k]));
      bool any = false;
      for (const auto& piece : per_key[k]) {
        tokens += static_cast<std::int64_t>(piece.size());
        any = any || !piece.empty();
      }
      if (any) ++tokens;  // the EOD the writer appends
    }
    ++documents;
    if (config.progress_seconds >= 0) {
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - last_report).count() >= config.progress_seconds) {
        last_report = now;
        report("");
      }
    }
  });
  std::vector<IndexedDatasetSummary> summaries;
  for (const auto& writer : writers) summaries.push_back(writer->finish());
  if (config.progress_seconds >= 0 &&
      std::chrono::duration<double>(Clock::now() - started).count() >= config.progress_seconds) {
    report("done, ");
  }
  return summaries;
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
