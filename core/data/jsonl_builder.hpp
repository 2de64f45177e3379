// `tandem data build` as a library call: JSON Lines documents with one text field per --json-keys
// key (a string, or a list of strings as Megatron's preprocessing accepts), tokenized by the byte
// tokenizer of SPEC 12 or a real one (core/data/text_tokenizer.hpp), written as one Megatron
// indexed dataset (SPEC 2) per key, under the names and with the bytes Megatron's
// tools/preprocess_data.py --append-eod writes (PREFIX_KEY_document.bin/.idx, SPEC 13). Also where
// the embedded default corpus lives and how it becomes a dataset at run time.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/data/indexed_dataset.hpp"

namespace tandem::data {

// Bad input to `tandem data build`: a bad line (the message names the file, the line number, what
// was wrong and the fix), or line 0 for an unknown tokenizer, a missing input or output folder.
class JsonlError : public std::runtime_error {
 public:
  JsonlError(const std::string& message, std::int64_t line)
      : std::runtime_error(message), line_(line) {}
  std::int64_t line() const { return line_; }  // 1-based

 private:
  std::int64_t line_;
};

// SPEC 12's byte tokenizer: ids 0-255 are the UTF-8 bytes of the text (EOD 256 and PAD 257 are
// never produced here; the writer appends EOD).
std::vector<std::int32_t> byte_tokenize(const std::string& utf8_text);

struct JsonlBuildConfig {
  std::string input_path;          // DOCS.jsonl: one JSON object per line
  std::string output_prefix;       // Megatron's --output-prefix P: writes P_K_document.{bin,idx} per key K
  TokenizerConfig tokenizer;       // Megatron's --tokenizer-type and its files; default: bytes (SPEC 12)
  // The fields holding each document's texts (Megatron's --json-keys): one dataset per key, in
  // this order, from one pass over the input. Each key once, none empty or holding '/'.
  std::vector<std::string> json_keys{"text"};
  // Seconds between progress lines on stderr (documents, tokens, and each per second); 0: after
  // every document; negative: none. Default 10: a long build says it is alive, a short one is quiet.
  double progress_seconds = 10.0;
};

// One document's tokens, in the pieces its "text" gives: one piece for a string, one per element
// for a list of strings (Megatron's preprocess_data.py tokenizes a list's elements one by one and
// records each non-empty one as a sequence of the document; the EOD ends the last).
using JsonlDocument = std::vector<std::vector<std::int32_t>>;

// The dataset prefix preprocess_data.py writes for `key` under --output-prefix `output_prefix`
// (without --split-sentences): "P_K_document". `tandem train --data-path` takes it as it is.
std::string megatron_document_prefix(const std::string& output_prefix, const std::string& key);

// Reads and checks every line of a one-key config, byte-tokenized (EOD not yet appended).
// Throws JsonlError naming the file and 1-based line of the first bad line.
std::vector<JsonlDocument> read_jsonl_documents(const JsonlBuildConfig& config);

// Writes byte-tokenized documents to PREFIX atomically (EOD appended to non-empty ones).
IndexedDatasetSummary write_documents(const std::string& prefix, const std::vector<JsonlDocument>& documents);

// Streams every line through the tokenizer into one writer per key and returns their summaries in
// the order of config.json_keys. On a bad key list, input or line throws JsonlError and leaves no
// output file behind (existing datasets under those names stay as they were); each key's pair is
// then replaced atomically, one after the other.
std::vector<IndexedDatasetSummary> build_dataset_from_jsonl(const JsonlBuildConfig& config);

// The embedded corpus (fixtures/corpus/default.jsonl). Looked up in order: the environment
// variable TANDEM_CORPUS (a file), the source tree this library was compiled from
// (TANDEM_SOURCE_DIR), then fixtures/corpus/ beside the running binary and each of its parent
// directories (a build folder inside a copied checkout). Throws naming every place it tried.
std::string default_corpus_jsonl_path();

// Builds the embedded corpus into DIRECTORY/default_corpus.{bin,idx} (creating DIRECTORY) and
// returns that prefix. Nothing is rewritten when the files there already hold exactly this corpus.
// With several ranks, call it on one rank and wait (a rewrite briefly removes PREFIX.idx).
std::string build_default_corpus_dataset(const std::string& directory);

}  // namespace tandem::data
