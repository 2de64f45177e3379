// Hugging Face Llama export of a checkpoint (core/checkpoint/hf_export.hpp, SPEC 12).
#include "core/checkpoint/hf_export.hpp"

#include <iostream>
#include <set>
#include <stdexcept>
#include <system_error>

#include "core/checkpoint/atomic_file.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/config.hpp"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const json& model_field(const json& run_config, std::string_view name) {
  const json::json_pointer pointer{"/model/" + std::string(name)};
  if (!run_config.is_object() || !run_config.contains(pointer)) {
    throw std::runtime_error("checkpoint run_config has no model." + std::string(name) +
                             "; the manifest is from an incompatible tandem version");
  }
  return run_config.at(pointer);
}

// The run's tokenizer id `name` ("eod", "pad"); null when it has none (a tokenizer without PAD).
json tokenizer_id(const json& run_config, const char* name, std::int32_t byte_tokenizer_id) {
  if (!run_config.contains("tokenizer")) return byte_tokenizer_id;
  return run_config.at("tokenizer").value(name, json());
}

std::int64_t model_integer(const json& run_config, std::string_view name) {
  const json& value = model_field(run_config, name);
  if (!value.is_number_integer() || value.get<std::int64_t>() <= 0) {
    throw std::runtime_error("checkpoint run_config model." + std::string(name) + " holds " +
                             value.dump() + ", not a positive integer");
  }
  return value.get<std::int64_t>();
}

bool model_flag(const json& run_config, std::string_view name) {
  const json& value = model_field(run_config, name);
  if (!value.is_boolean()) {
    throw std::runtime_error("checkpoint run_config model." + std::string(name) + " holds " +
                             value.dump() + ", not true or false");
  }
  return value.get<bool>();
}

double model_number(const json& run_config, std::string_view name) {
  const json& value = model_field(run_config, name);
  if (!value.is_number()) {
    throw std::runtime_error("checkpoint run_config model." + std::string(name) + " holds " +
                             value.dump() + ", not a number");
  }
  return value.get<double>();
}

}  // namespace

json llama_config(const json& run_config, std::string_view torch_dtype) {
  const std::int64_t hidden = model_integer(run_config, "hidden_size");
  const std::int64_t heads = model_integer(run_config, "num_attention_heads");
  const bool biases = model_flag(run_config, "add_bias_linear");
  return json{
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_size", hidden},
      {"intermediate_size", model_integer(run_config, "ffn_hidden_size")},
      {"num_hidden_layers", model_integer(run_config, "num_layers")},
      {"num_attention_heads", heads},
      {"num_key_value_heads", model_integer(run_config, "num_query_groups")},
      {"head_dim", hidden / heads},
      // The model's vocabulary is the padded one (SPEC 12): its embedding has that many rows.
      {"vocab_size", model_integer(run_config, "padded_vocab_size")},
      {"max_position_embeddings", model_integer(run_config, "seq_length")},
      {"rms_norm_eps", model_number(run_config, "norm_epsilon")},
      {"rope_theta", model_number(run_config, "rotary_base")},
      {"rope_scaling", nullptr},
      {"attention_bias", biases},
      {"attention_dropout", 0.0},
      {"mlp_bias", biases},
      {"tie_word_embeddings", model_flag(run_config, "tie_embeddings")},
      {"hidden_act", "silu"},
      {"initializer_range", model_number(run_config, "init_method_std")},
      {"pretraining_tp", 1},
      {"use_cache", true},
      {"torch_dtype", torch_dtype},
      // A document starts after an EOD, so EOD serves as BOS too (the byte tokenizer has no
      // BOS). The ids are the run's tokenizer's (SPEC 13; absent: the byte tokenizer's).
      {"bos_token_id", tokenizer_id(run_config, "eod", kEodToken)},
      {"eos_token_id", tokenizer_id(run_config, "eod", kEodToken)},
      {"pad_token_id", tokenizer_id(run_config, "pad", kPadToken)},
  };
}

std::vector<ExpectedTensor> expected_llama_tensors(const json& run_config) {
  const std::int64_t d = model_integer(run_config, "hidden_size");
  const std::int64_t heads = model_integer(run_config, "num_attention_heads");
  const std::int64_t kv = model_integer(run_config, "num_query_groups") * (d / heads);
  const std::int64_t ffn = model_integer(run_config, "ffn_hidden_size");
  const std::int64_t vocab = model_integer(run_config, "padded_vocab_size");
  const std::int64_t layers = model_integer(run_config, "num_layers");
  const bool biases = model_flag(run_config, "add_bias_linear");
  const bool tied = model_flag(run_config, "tie_embeddings");

  std::vector<ExpectedTensor> expected{{"model.embed_tokens.weight", {vocab, d}}};
  auto linear = [&](const std::string& prefix, std::int64_t out, std::int64_t in) {
    expected.push_back({prefix + ".weight", {out, in}});
    if (biases) expected.push_back({prefix + ".bias", {out}});
  };
  for (std::int64_t layer = 0; layer < layers; ++layer) {
    const std::string block = "model.layers." + std::to_string(layer);
    expected.push_back({block + ".input_layernorm.weight", {d}});
    linear(block + ".self_attn.q_proj", d, d);
    linear(block + ".self_attn.k_proj", kv, d);
    linear(block + ".self_attn.v_proj", kv, d);
    linear(block + ".self_attn.o_proj", d, d);
    expected.push_back({block + ".post_attention_layernorm.weight", {d}});
    linear(block + ".mlp.gate_proj", ffn, d);
    linear(block + ".mlp.up_proj", ffn, d);
    linear(block + ".mlp.down_proj", d, ffn);
  }
  expected.push_back({"model.norm.weight", {d}});
  if (!tied) expected.push_back({"lm_head.weight", {vocab, d}});
  return expected;
}

ExportSummary export_hugging_face(const ExportOptions& options) {
  std::string dtype;
  std::string torch_dtype;
  if (options.dtype == "f32") {
    dtype = kDtypeF32;
    torch_dtype = "float32";
  } else if (options.dtype == "bf16") {
    dtype = kDtypeBF16;
    torch_dtype = "bfloat16";
  } else {
    throw std::invalid_argument("--dtype " + options.dtype + " is not f32 or bf16; pick one of them");
  }
  fs::path out = options.hf_out.lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "OUT/" names OUT
  std::error_code ignored;
  if (fs::exists(out, ignored) && !(fs::is_directory(out, ignored) && fs::is_empty(out, ignored))) {
    throw std::runtime_error("--hf " + out.string() +
                             " already exists and is not an empty directory; remove it or choose "
                             "another path (an export never overwrites files)");
  }

  ExportSummary summary;
  summary.checkpoint_directory = resolve_checkpoint_directory(options.load);
  LoadOptions load_options;
  load_options.read_optimizer = false;
  const CheckpointState state = load_checkpoint(summary.checkpoint_directory, load_options);
  summary.iteration = state.counters.iteration;
  const bool tied = model_flag(state.run_config, "tie_embeddings");
  const std::string where = (summary.checkpoint_directory / kModelFileName).string();

  // Every tensor the configuration implies must be there with its shape; nothing else may be,
  // except lm_head.weight of a tied model (SPEC 4: the one tensor is stored once; dropped here).
  std::vector<TensorData> exported;
  std::set<std::string> expected_names;
  for (const auto& expected : expected_llama_tensors(state.run_config)) {
    const TensorData& tensor = find_tensor(state.model_tensors, expected.name, where);
    if (tensor.shape != expected.shape) {
      throw std::runtime_error(where + ": tensor " + expected.name + " has shape " +
                               json(tensor.shape).dump() + " but the checkpoint's configuration "
                               "implies " + json(expected.shape).dump());
    }
    exported.push_back(convert_tensor(tensor, dtype));
    summary.parameters += element_count(tensor.shape);
    expected_names.insert(expected.name);
  }
  for (const auto& tensor : state.model_tensors) {
    if (expected_names.count(tensor.name) != 0) continue;
    if (tied && tensor.name == "lm_head.weight") continue;
    throw std::runtime_error(where + ": tensor " + tensor.name +
                             " is not part of a Llama model of the checkpoint's configuration");
  }
  summary.tensors = exported.size();

  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  for (const auto& leftover : remove_abandoned_staging(out)) {
    std::cerr << "note: removed " << leftover.string() << ", left by an export that was killed (no process held it)\n";
  }
  StagedDirectory staged(out);
  FileWriter config_writer(staged.staging_path() / "config.json");
  config_writer.write(llama_config(state.run_config, torch_dtype).dump(2) + "\n");
  config_writer.close();
  summary.model_bytes =
      write_safetensors(staged.staging_path() / "model.safetensors", exported, {{"format", "pt"}})
          .size_bytes;
  staged.commit();
  return summary;
}

}  // namespace tandem::checkpoint
