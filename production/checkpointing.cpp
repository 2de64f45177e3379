// Production trainer state <-> checkpoint (checkpointing.hpp).
#include "production/checkpointing.hpp"

#include <span>
#include <stdexcept>

#include "core/checkpoint/resume_check.hpp"

namespace tandem::production {
namespace {

// The reference's prefixes (reference/checkpointing.cpp), so both engines' files read alike.
constexpr const char* kExpAvgPrefix = "exp_avg.";
constexpr const char* kExpAvgSqPrefix = "exp_avg_sq.";

std::vector<checkpoint::TensorData> tensors_of(const ModelLayout& layout,
                                               const std::vector<float>& flat,
                                               const std::string& prefix) {
  std::vector<checkpoint::TensorData> tensors;
  for (const auto& tensor : layout.tensors) {
    const std::span<const float> values(flat.data() + tensor.offset,
                                        static_cast<std::size_t>(tensor.numel));
    tensors.push_back(checkpoint::make_f32_tensor(prefix + tensor.name, tensor.shape, values));
  }
  return tensors;
}

void read_tensors(const ModelLayout& layout, const std::vector<checkpoint::TensorData>& tensors,
                  const std::string& prefix, const std::string& where, std::vector<float>& flat) {
  flat.assign(static_cast<std::size_t>(layout.total_elements), 0.0f);
  for (const auto& tensor : layout.tensors) {
    const auto& stored = checkpoint::find_tensor(tensors, prefix + tensor.name, where);
    if (stored.shape != tensor.shape) {
      throw std::runtime_error(where + ": tensor " + stored.name +
                               " has a different shape than this run's model; fix: resume with "
                               "the model configuration the checkpoint was written with");
    }
    const std::vector<float> values = checkpoint::f32_values(stored);
    std::copy(values.begin(), values.end(), flat.begin() + tensor.offset);
  }
}

}  // namespace

checkpoint::CheckpointState make_checkpoint_state(const Trainer& trainer) {
  const HostState state = trainer.host_state();
  const auto& config = trainer.config();
  checkpoint::CheckpointState out;
  out.engine = "production";
  out.precision = "F32";  // SPEC 9: the engine's main precision
  to_json(out.run_config, config);
  out.parallel_layout = out.run_config.at("parallel");
  const Counters& c = state.counters;
  out.counters = {c.iteration,   c.consumed_samples, c.successful_updates, c.skipped_updates,
                  c.consecutive_skips, c.input_tokens, c.loss_tokens, c.pad_tokens};
  out.optimizer_step = c.successful_updates;
  out.scheduler_samples = c.scheduler_samples;
  // The sample order is a pure function of (dataset, config, global index).
  out.data_position = {{"next_global_sample", c.consumed_samples}};
  // Every random stream is counter-based and derived from --seed (docs/MODEL.md, docs/DATA.md).
  out.random_streams = {{"seed", config.data.seed}};
  out.extra = {{"compute_precision", trainer.compute_dtype() == DType::bf16 ? "bf16" : "fp32"}};
  out.model_tensors = tensors_of(trainer.layout(), state.params, "");
  out.optimizer_tensors = tensors_of(trainer.layout(), state.exp_avg, kExpAvgPrefix);
  auto second = tensors_of(trainer.layout(), state.exp_avg_sq, kExpAvgSqPrefix);
  out.optimizer_tensors.insert(out.optimizer_tensors.end(), second.begin(), second.end());
  return out;
}

void restore_checkpoint_state(Trainer& trainer, const checkpoint::CheckpointState& saved) {
  if (saved.engine != "production" || saved.precision != "F32") {
    throw std::runtime_error("--load: the checkpoint was written by the " + saved.engine +
                             " engine in " + saved.precision +
                             "; fix: resume it with the engine that wrote it");
  }
  checkpoint::check_resume_settings(saved.run_config, trainer.config());
  HostState state;
  read_tensors(trainer.layout(), saved.model_tensors, "", "model.safetensors", state.params);
  read_tensors(trainer.layout(), saved.optimizer_tensors, kExpAvgPrefix, "optimizer.safetensors",
               state.exp_avg);
  read_tensors(trainer.layout(), saved.optimizer_tensors, kExpAvgSqPrefix,
               "optimizer.safetensors", state.exp_avg_sq);
  const auto& c = saved.counters;
  state.counters = Counters{c.iteration,      c.consumed_samples, c.successful_updates,
                            c.skipped_updates, c.consecutive_skipped_updates, c.input_tokens,
                            c.loss_tokens,    c.pad_tokens,       saved.scheduler_samples};
  trainer.restore(state);
}

}  // namespace tandem::production
