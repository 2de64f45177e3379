// `tandem data build --input DOCS.jsonl --output-prefix PREFIX [--tokenizer bytes]` (SPEC 12):
// JSON Lines documents -> byte tokens -> a Megatron indexed dataset PREFIX.bin / PREFIX.idx.
// A bad line is an error naming the line, exit status 2, and no output files.
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "core/data/jsonl_builder.hpp"

namespace tandem::cli {
namespace {

constexpr int kExitBadInput = 2;  // main.cpp's convention: 2 for bad input

struct DataBuildState {
  data::JsonlBuildConfig build;
};

Command add_data_command(CLI::App& parent) {
  auto state = std::make_shared<DataBuildState>();
  CLI::App* data = parent.add_subcommand("data", "Prepare datasets (SPEC 2, 12)");
  data->require_subcommand(1);
  CLI::App* build = data->add_subcommand(
      "build", "Tokenize JSON Lines documents (a \"text\" field per line) with the byte tokenizer "
               "and write Megatron's PREFIX.bin / PREFIX.idx, EOD appended to every document");
  build->add_option("--input", state->build.input_path, "DOCS.jsonl: one JSON object per line")
      ->required();
  build->add_option("--output-prefix", state->build.output_prefix,
                    "writes PREFIX.bin and PREFIX.idx (the directory must exist)")
      ->required();
  build->add_option("--tokenizer", state->build.tokenizer,
                    "bytes: ids 0-255 are UTF-8 bytes, EOD 256, PAD 257 (SPEC 12)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bytes"}));

  Command command;
  command.app = data;
  command.run = [state]() {
    try {
      const auto summary = data::build_dataset_from_jsonl(state->build);
      std::cout << "documents: " << summary.documents << " (" << summary.empty_documents
                << " empty)\n"
                << "sequences: " << summary.sequences << "\n"
                << "tokens:    " << summary.tokens << " (" << summary.sequences << " EOD)\n"
                << "dtype:     " << data::to_string(summary.dtype) << " (code "
                << static_cast<int>(summary.dtype) << ")\n"
                << "wrote:     " << summary.bin_path << ", " << summary.idx_path << "\n";
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
