// `tandem data build --input DOCS.jsonl --output-prefix PREFIX [--tokenizer-type T ...]` (SPEC 12):
// JSON Lines documents -> tokens (the byte tokenizer, or Megatron's GPT2BPETokenizer /
// HuggingFaceTokenizer / SentencePiece options) -> one Megatron indexed dataset per --json-keys key,
// PREFIX_KEY_document.bin / .idx: the names and bytes Megatron's tools/preprocess_data.py
// --append-eod writes. A bad line or option is an error naming it, exit status 2, and no output
// files.
// `tandem data samples [RUN OPTIONS] [--part train|valid] [--first I] [--count N]`: the token
// windows the trainers read, one sample per line, so the order can be checked against Megatron
// (tests/megatron/) or by eye.
// `tandem data inspect [PREFIX] [RUN OPTIONS] [--part train|valid] [--sample N]`: one of those
// samples decoded, with its documents, positions, attention spans and loss mask
// (core/data/inspect.hpp). Both open the samples as the trainers do (open_part below).
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "core/args.hpp"
#include "core/data/inspect.hpp"
#include "core/data/jsonl_builder.hpp"
#include "core/data/tokenizer.hpp"
#include "core/data/training_data.hpp"

namespace tandem::cli {
namespace {

constexpr int kExitBadInput = 2;  // main.cpp's convention: 2 for bad input

struct DataBuildState {
  data::JsonlBuildConfig build;
  std::string tokenizer = "bytes";      // --tokenizer: tandem's older spelling of --tokenizer-type bytes
  std::string tokenizer_type;           // --tokenizer-type, Megatron's spelling
  std::vector<std::string> json_keys;   // --json-keys: one dataset per key; default text
  bool append_eod = false;              // --append-eod: always on in tandem (SPEC 2); accepted
  bool split_sentences = false;         // --split-sentences: refused
  int workers = 1;                      // --workers: accepted; tandem tokenizes on one thread
};

// Resolves the build's options into state->build; throws ConfigError (exit 2) naming the option.
void resolve_build_options(DataBuildState& state) {
  if (state.split_sentences) {
    throw ConfigError({ConfigIssue{"--split-sentences", "given",
                                   "tandem does not split documents into sentences (Megatron does it with NLTK's "
                                   "punkt models and writes PREFIX_KEY_sentence); each document is one sequence",
                                   "drop --split-sentences, or split with Megatron's preprocess_data.py, or give "
                                   "each document's \"text\" as a list of sentences"}});
  }
  if (!state.json_keys.empty()) state.build.json_keys = state.json_keys;  // checked by the build
  if (!state.tokenizer_type.empty()) {
    const auto type = data::parse_tokenizer_type(state.tokenizer_type);
    if (!type) {
      throw ConfigError({ConfigIssue{"--tokenizer-type", state.tokenizer_type,
                                     "is not a tokenizer type tandem builds with (bytes, GPT2BPETokenizer, "
                                     "HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer; "
                                     "Megatron's spelling)",
                                     "name the tokenizer to build with, e.g. --tokenizer-type GPT2BPETokenizer"}});
    }
    state.build.tokenizer.type = *type;
  }
  const auto& tokenizer = state.build.tokenizer;
  const auto only_for = [&](const char* option, const std::string& value, bool read, const char* readers) {
    if (!value.empty() && !read) {
      throw ConfigError({ConfigIssue{option, value,
                                     "is read only by --tokenizer-type " + std::string(readers) + ", not " +
                                         to_string(tokenizer.type),
                                     "drop it, or name the tokenizer that reads it"}});
    }
  };
  only_for("--vocab-file", tokenizer.vocab_file, tokenizer.type == TokenizerType::gpt2_bpe, "GPT2BPETokenizer");
  only_for("--merge-file", tokenizer.merge_file, tokenizer.type == TokenizerType::gpt2_bpe, "GPT2BPETokenizer");
  only_for("--tokenizer-model", tokenizer.tokenizer_model,
           tokenizer.type == TokenizerType::huggingface || tokenizer.type == TokenizerType::sentencepiece ||
               tokenizer.type == TokenizerType::llama2,
           "HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer");
}

struct DataSamplesState {
  RunArguments run;
  std::string part = "train";  // which --split part: train | valid
  std::int64_t first = 0;      // first sample printed
  std::int64_t count = -1;     // samples printed; -1: every sample under --data-order megatron
};

struct DataInspectState {
  RunArguments run;
  std::string prefix;          // positional PREFIX: the same as --data-path PREFIX
  std::string part = "train";  // which --split part: train | valid
  std::int64_t sample = 0;     // the sample shown
};

// The samples of `part` that the trainers read for these run options.
struct OpenedPart {
  RunConfig config;
  std::shared_ptr<const data::TrainingSamples> samples;
};
OpenedPart open_part(const RunArguments& run, const std::string& part) {
  OpenedPart opened;
  opened.config = build_run_config(run);  // ConfigError -> exit 2 in main
  const data::DatasetSplit split =
      part == "valid" ? data::DatasetSplit::valid : data::DatasetSplit::train;
  opened.samples =
      data::open_training_samples_at(data::resolve_data_path(opened.config), opened.config, split);
  return opened;
}

// Samples in Megatron's dataset of `samples` (--data-order megatron, one dataset); -1 when the
// stream has no end (tandem's orders, blends).
std::int64_t dataset_length(const data::TrainingSamples& samples) {
  const auto* index = samples.datasets().front().samples->megatron_index();
  return index != nullptr && samples.datasets().size() == 1 ? index->sample_count() : -1;
}

// Prints `first .. first+count-1` of the run's samples of `part`, one line each:
// "INDEX TOKEN0 ... TOKEN_L" (the L+1 window tokens: inputs then the last label).
int print_samples(const DataSamplesState& state) {
  const auto [config, samples] = open_part(state.run, state.part);
  std::int64_t count = state.count;
  if (count < 0) {
    const std::int64_t length = dataset_length(*samples);
    if (length < 0) {
      std::cerr << "error: --count = (unset): the stream of --data-order "
                << to_string(config.data.data_order)
                << " never ends; fix: give --count N (every sample is the default only for "
                   "--data-order megatron, whose dataset has a length)\n";
      return kExitBadInput;
    }
    count = std::max<std::int64_t>(0, length - state.first);
  }
  std::string line;
  for (std::int64_t i = state.first; i < state.first + count; ++i) {
    line = std::to_string(i);
    for (const std::int32_t token : samples->window_tokens(i)) {
      line += ' ';
      line += std::to_string(token);
    }
    line += '\n';
    std::cout << line;
  }
  return 0;
}

// Prints sample `state.sample` of `part` as describe_sample's text.
int inspect_sample(DataInspectState state) {
  if (!state.prefix.empty()) {
    if (!state.run.data_paths.empty()) {
      std::cerr << "error: PREFIX = " << state.prefix << " and --data-path = "
                << state.run.data_paths.front()
                << ": both name the data; fix: give one of them (PREFIX is --data-path PREFIX)\n";
      return kExitBadInput;
    }
    state.run.data_paths = {state.prefix};
  }
  const auto [config, samples] = open_part(state.run, state.part);
  const std::int64_t length = dataset_length(*samples);
  if (length >= 0 && state.sample >= length) {
    std::cerr << "error: --sample = " << state.sample << ": Megatron's dataset of the " << state.part
              << " part holds " << length << " samples (0.." << length - 1
              << "); fix: give --sample below " << length
              << " or a larger --train-samples\n";
    return kExitBadInput;
  }
  data::InspectContext context;
  context.source = samples->summary() + ", " + state.part + " part, --data-order " +
                   to_string(config.data.data_order) + ", --packing " +
                   to_string(config.data.packing);
  if (samples->datasets().size() > 1) {
    const auto position = samples->position(state.sample);
    context.source += " (blend: sample " + std::to_string(position.dataset_sample) + " of " +
                      samples->datasets()[static_cast<std::size_t>(position.dataset)].prefix + ")";
  }
  context.tokenizer = config.tokenizer;
  context.vocab_size = config.model.vocab_size;
  context.reset_position_ids = config.data.reset_position_ids;
  context.reset_attention_mask = config.data.reset_attention_mask;
  context.eod_mask_loss = config.data.eod_mask_loss;
  // The trainers' own sample (build_sample: SPEC 3 masks and positions), not a recomputation.
  const Sample sample = samples->sample(state.sample);
  std::cout << data::describe_sample(sample, samples->window_tokens(state.sample), context);
  return 0;
}

Command add_data_command(CLI::App& parent) {
  auto state = std::make_shared<DataBuildState>();
  CLI::App* data = parent.add_subcommand("data", "Prepare datasets (SPEC 2, 12)");
  data->require_subcommand(1);
  CLI::App* build = data->add_subcommand(
      "build", "Tokenize JSON Lines documents (the --json-keys fields of each line, default \"text\") "
               "with the byte tokenizer "
               "or Megatron's GPT2BPETokenizer / byte-level HuggingFaceTokenizer / "
               "SentencePieceTokenizer / Llama2Tokenizer, and write "
               "one Megatron dataset per --json-keys key, PREFIX_KEY_document.bin / .idx, as its "
               "tools/preprocess_data.py --append-eod does (EOD after every non-empty document; "
               "uint16 below 65,500 ids, else int32); train with --data-path PREFIX_KEY_document; "
               "docs/DATA.md sections 1 and 13");
  build->add_option("--input", state->build.input_path, "DOCS.jsonl: one JSON object per line")
      ->required();
  build->add_option("--output-prefix", state->build.output_prefix,
                    "writes PREFIX_KEY_document.bin and .idx for each --json-keys KEY, preprocess_data.py's "
                    "names (the directory must exist)")
      ->required();
  build->add_option("--tokenizer", state->tokenizer,
                    "bytes: ids 0-255 are UTF-8 bytes, EOD 256, PAD 257 (SPEC 12; the same as "
                    "--tokenizer-type bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bytes"}));
  build->add_option("--tokenizer-type", state->tokenizer_type,
                    "Megatron's tokenizer type: bytes (default), GPT2BPETokenizer (--vocab-file, "
                    "--merge-file), HuggingFaceTokenizer (--tokenizer-model DIR with a byte-level BPE "
                    "tokenizer.json), SentencePieceTokenizer or Llama2Tokenizer (--tokenizer-model FILE.model)")
      ->excludes("--tokenizer");
  build->add_option("--vocab-file", state->build.tokenizer.vocab_file, "GPT2BPETokenizer: GPT-2's vocab.json");
  build->add_option("--merge-file", state->build.tokenizer.merge_file, "GPT2BPETokenizer: GPT-2's merges.txt");
  build->add_option("--tokenizer-model", state->build.tokenizer.tokenizer_model,
                    "HuggingFaceTokenizer: a local directory holding tokenizer.json (and tokenizer_config.json); "
                    "SentencePieceTokenizer, Llama2Tokenizer: the SentencePiece .model file");
  build->add_option("--json-keys", state->json_keys,
                    "the fields holding each document's text, one dataset per key, from one pass "
                    "(default: text)");
  build->add_flag("--append-eod", state->append_eod,
                  "accepted for Megatron's command line: tandem always appends the EOD (SPEC 2)");
  build->add_flag("--split-sentences", state->split_sentences, "refused: tandem does not split sentences");
  build->add_option("--workers", state->workers,
                    "accepted for Megatron's command line; tandem tokenizes on one thread")
      ->check(CLI::PositiveNumber);
  build->add_option("--progress-seconds", state->build.progress_seconds,
                    "seconds between progress lines on stderr (documents, tokens, and per second); "
                    "0: every document; negative: none")
      ->capture_default_str();

  auto samples_state = std::make_shared<DataSamplesState>();
  CLI::App* samples = data->add_subcommand(
      "samples", "Print the token windows the trainers read (L+1 tokens: the inputs and the last "
                 "label), one sample per line as \"INDEX TOKENS...\", for the run options given");
  add_run_options(*samples, samples_state->run);
  samples->add_option("--part", samples_state->part, "the --split part to read: train | valid")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "valid"}));
  samples->add_option("--first", samples_state->first, "first sample index (default: 0)")
      ->check(CLI::NonNegativeNumber);
  samples->add_option("--count", samples_state->count,
                      "samples to print (default: all of Megatron's dataset under --data-order "
                      "megatron; required otherwise)")
      ->check(CLI::NonNegativeNumber);

  auto inspect_state = std::make_shared<DataInspectState>();
  CLI::App* inspect = data->add_subcommand(
      "inspect", "Show one sample as the trainers read it: its tokens decoded (byte tokenizer, "
                 "GPT2BPETokenizer, byte-level HuggingFaceTokenizer; ids otherwise), its documents, and per position the label, the loss mask, the "
                 "position and the attention span (SPEC 3), for the run options given");
  inspect->add_option("prefix", inspect_state->prefix,
                      "PREFIX of PREFIX.bin / PREFIX.idx (the same as --data-path PREFIX; "
                      "without either, the embedded corpus)");
  add_run_options(*inspect, inspect_state->run);
  inspect->add_option("--part", inspect_state->part, "the --split part to read: train | valid")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "valid"}));
  inspect->add_option("--sample", inspect_state->sample,
                      "the sample's index in the part's training order (default: 0)")
      ->check(CLI::NonNegativeNumber);

  Command command;
  command.app = data;
  command.run = [state, samples, samples_state, inspect, inspect_state]() {
    if (samples->parsed()) return print_samples(*samples_state);
    if (inspect->parsed()) return inspect_sample(*inspect_state);
    try {
      resolve_build_options(*state);  // ConfigError -> exit 2 in main
      const auto summaries = data::build_dataset_from_jsonl(state->build);
      // The ids the data was built with, as training will read them (SPEC 13).
      TokenizerConfig tokenizer = state->build.tokenizer;
      const data::TokenizerIds ids = data::read_tokenizer_ids(tokenizer);
      tokenizer.eod_token = ids.eod_token;
      tokenizer.pad_token = ids.pad_token;
      std::cout << "tokenizer: " << data::tokenizer_summary(tokenizer, ids.vocab_size) << "\n";
      for (std::size_t k = 0; k < summaries.size(); ++k) {
        const auto& summary = summaries[k];
        const std::string prefix =
            data::megatron_document_prefix(state->build.output_prefix, state->build.json_keys[k]);
        std::cout << "dataset:   " << prefix << " (key \"" << state->build.json_keys[k]
                  << "\"; train with --data-path " << prefix << ")\n"
                  << "documents: " << summary.documents << " (" << summary.empty_documents << " empty)\n"
                  << "sequences: " << summary.sequences << "\n"
                  << "tokens:    " << summary.tokens << " (" << summary.documents - summary.empty_documents
                  << " EOD)\n"
                  << "dtype:     " << data::to_string(summary.dtype) << " (code " << static_cast<int>(summary.dtype)
                  << ")\n"
                  << "wrote:     " << summary.bin_path << ", " << summary.idx_path << "\n";
      }
      return 0;
    } catch (const data::JsonlError& error) {
      std::cerr << "error: " << error.what() << "\n";
      return kExitBadInput;
    }
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(30, add_data_command);

}  // namespace tandem::cli
