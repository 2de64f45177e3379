// `tandem export`: a checkpoint's main weights as a Hugging Face Llama model directory (SPEC 12):
// OUT/config.json (a LlamaConfig built from the checkpoint's run_config) and OUT/model.safetensors
// (float32, or bfloat16 with --dtype bf16, each value rounded to nearest even from the stored
// precision). The tensors already carry Hugging Face names and pass through by name; their
// presence and shapes are checked against the configuration first. OUT appears complete or not at
// all (a staged directory renamed into place).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/tensor_data.hpp"

namespace tandem::checkpoint {

struct ExportOptions {
  std::filesystem::path load;  // --load: a --save directory (latest iteration) or an iter_ dir
  std::filesystem::path hf_out;  // --hf: the directory to create; must not exist or be empty
  std::string dtype = "f32";     // --dtype: "f32" or "bf16"
};

struct ExportSummary {
  std::filesystem::path checkpoint_directory;  // the iter_ directory read
  std::int64_t iteration = 0;
  std::size_t tensors = 0;          // tensors written
  std::int64_t parameters = 0;      // elements written
  std::uint64_t model_bytes = 0;    // size of OUT/model.safetensors
};

// The LlamaConfig for a checkpoint's run_config (to_json(RunConfig) form); `torch_dtype` is
// "float32" or "bfloat16". Throws naming a missing or mistyped run_config field.
nlohmann::json llama_config(const nlohmann::json& run_config, std::string_view torch_dtype);

// The Hugging Face tensor names and shapes the configuration implies ([out, in] for linear
// weights), lm_head.weight only when untied, biases only with add_bias_linear.
struct ExpectedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};
std::vector<ExpectedTensor> expected_llama_tensors(const nlohmann::json& run_config);

ExportSummary export_hugging_face(const ExportOptions& options);

}  // namespace tandem::checkpoint
