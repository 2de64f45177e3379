// Main state <-> checkpoint (main_state.hpp), for double and float.
#include "core/checkpoint/main_state.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <type_traits>

#include "core/checkpoint/resume_check.hpp"

namespace tandem::checkpoint {
namespace {

template <class Scalar>
constexpr std::string_view dtype_of() {
  return std::is_same_v<Scalar, double> ? kDtypeF64 : kDtypeF32;
}

template <class Scalar>
void append_tensors(const ModelLayout& layout, const std::vector<Scalar>& flat,
                    const std::string& prefix, std::vector<TensorData>& out) {
  for (const auto& tensor : layout.tensors) {
    const std::span<const Scalar> values(flat.data() + tensor.offset,
                                         static_cast<std::size_t>(tensor.numel));
    if constexpr (std::is_same_v<Scalar, double>) {
      out.push_back(make_f64_tensor(prefix + tensor.name, tensor.shape, values));
    } else {
      out.push_back(make_f32_tensor(prefix + tensor.name, tensor.shape, values));
    }
  }
}

template <class Scalar>
std::vector<Scalar> read_tensors(const ModelLayout& layout, const std::vector<TensorData>& tensors,
                                 const std::string& prefix, const std::string& where) {
  std::vector<Scalar> flat(static_cast<std::size_t>(layout.total_elements), Scalar(0));
  for (const auto& tensor : layout.tensors) {
    const auto& stored = find_tensor(tensors, prefix + tensor.name, where);
    if (stored.shape != tensor.shape) {
      throw std::runtime_error(where + ": tensor " + stored.name +
                               " has a different shape than this run's model; fix: resume with "
                               "the model configuration the checkpoint was written with");
    }
    std::vector<Scalar> values;
    if constexpr (std::is_same_v<Scalar, double>) {
      values = values_as_f64(stored);  // exact from F64, F32 or BF16 (callers check the dtype)
    } else {
      values = f32_values(stored);
    }
    std::copy(values.begin(), values.end(), flat.begin() + tensor.offset);
  }
  return flat;
}

}  // namespace

template <class Scalar>
CheckpointState main_checkpoint_metadata(const std::string& engine, const RunConfig& config, const Counters& counters) {
  CheckpointState out;
  out.engine = engine;
  out.precision = std::string(dtype_of<Scalar>());  // SPEC 9: the engine's main precision
  to_json(out.run_config, config);
  out.parallel_layout = out.run_config.at("parallel");
  out.counters = counters;
  // The sample order is a pure function of (dataset, config, global index): the next sample is
  // global index consumed_samples.
  out.data_position = {{"next_global_sample", counters.consumed_samples}};
  // Every random stream is counter-based and derived from --seed (docs/MODEL.md, docs/DATA.md).
  out.random_streams = {{"seed", config.data.seed}};
  return out;
}

template <class Scalar>
CheckpointState make_main_checkpoint(const std::string& engine, const RunConfig& config,
                                     const ModelLayout& layout, const MainState<Scalar>& state) {
  CheckpointState out = main_checkpoint_metadata<Scalar>(engine, config, state.counters);
  append_tensors(layout, state.params, "", out.model_tensors);
  append_tensors(layout, state.exp_avg, std::string(kExpAvgPrefix), out.optimizer_tensors);
  append_tensors(layout, state.exp_avg_sq, std::string(kExpAvgSqPrefix), out.optimizer_tensors);
  return out;
}

template <class Scalar>
std::vector<SettingChange> check_main_checkpoint(const std::string& engine, const RunConfig& resumed,
                                                 const CheckpointState& saved) {
  if (saved.engine != engine || saved.precision != dtype_of<Scalar>()) {
    throw std::runtime_error("--load: the checkpoint was written by the " + saved.engine +
                             " engine in " + saved.precision + "; fix: resume it with the " +
                             saved.engine + " engine");
  }
  return check_resume_settings(saved.run_config, resumed);
}

template <class Scalar>
MainState<Scalar> read_main_checkpoint(const std::string& engine, const RunConfig& resumed,
                                       const ModelLayout& layout, const CheckpointState& saved) {
  check_main_checkpoint<Scalar>(engine, resumed, saved);
  MainState<Scalar> state;
  state.params = read_tensors<Scalar>(layout, saved.model_tensors, "", "model.safetensors");
  state.exp_avg =
      read_tensors<Scalar>(layout, saved.optimizer_tensors, std::string(kExpAvgPrefix), "optimizer.safetensors");
  state.exp_avg_sq = read_tensors<Scalar>(layout, saved.optimizer_tensors, std::string(kExpAvgSqPrefix),
                                          "optimizer.safetensors");
  state.counters = saved.counters;
  return state;
}

MainState<double> read_main_state_widened(const ModelLayout& layout, const CheckpointState& saved) {
  MainState<double> state;
  state.params = read_tensors<double>(layout, saved.model_tensors, "", "model.safetensors");
  state.exp_avg =
      read_tensors<double>(layout, saved.optimizer_tensors, std::string(kExpAvgPrefix), "optimizer.safetensors");
  state.exp_avg_sq =
      read_tensors<double>(layout, saved.optimizer_tensors, std::string(kExpAvgSqPrefix), "optimizer.safetensors");
  state.counters = saved.counters;
  return state;
}

template CheckpointState make_main_checkpoint(const std::string&, const RunConfig&,
                                              const ModelLayout&, const MainState<double>&);
template CheckpointState make_main_checkpoint(const std::string&, const RunConfig&,
                                              const ModelLayout&, const MainState<float>&);
template CheckpointState main_checkpoint_metadata<double>(const std::string&, const RunConfig&, const Counters&);
template CheckpointState main_checkpoint_metadata<float>(const std::string&, const RunConfig&, const Counters&);
template std::vector<SettingChange> check_main_checkpoint<double>(const std::string&, const RunConfig&,
                                                                  const CheckpointState&);
template std::vector<SettingChange> check_main_checkpoint<float>(const std::string&, const RunConfig&,
                                                                 const CheckpointState&);
template MainState<double> read_main_checkpoint(const std::string&, const RunConfig&,
                                                const ModelLayout&, const CheckpointState&);
template MainState<float> read_main_checkpoint(const std::string&, const RunConfig&,
                                               const ModelLayout&, const CheckpointState&);

}  // namespace tandem::checkpoint
