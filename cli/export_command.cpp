// `tandem export --load DIR --hf OUT [--dtype f32|bf16]`: a checkpoint as a Hugging Face Llama
// model directory (SPEC 12; the work is in core/checkpoint/hf_export.hpp).
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "core/checkpoint/hf_export.hpp"

namespace tandem::cli {
namespace {

Command add_export_command(CLI::App& parent) {
  auto options = std::make_shared<checkpoint::ExportOptions>();
  auto* app = parent.add_subcommand(
      "export", "Write a checkpoint's weights as a Hugging Face Llama model (config.json + "
                "model.safetensors), loadable by transformers' LlamaForCausalLM");
  app->add_option("--load", options->load,
                  "checkpoint: a --save directory (its latest iteration) or an iter_NNNNNNN "
                  "directory")
      ->required();
  app->add_option("--hf", options->hf_out,
                  "output directory to create; must not exist, or be empty")
      ->required();
  app->add_option("--dtype", options->dtype,
                  "dtype of the exported weights: f32 (default) or bf16, rounded to nearest even "
                  "from the stored precision")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  return Command{app, [options] {
                   const auto summary = checkpoint::export_hugging_face(*options);
                   std::cout << "exported iteration " << summary.iteration << " from "
                             << summary.checkpoint_directory.string() << ": " << summary.tensors
                             << " tensors, " << summary.parameters << " parameters, "
                             << options->dtype << ", " << summary.model_bytes
                             << " bytes -> " << options->hf_out.string() << "\n";
                   return 0;
                 }};
}

}  // namespace

TANDEM_COMMAND(60, add_export_command);

}  // namespace tandem::cli
