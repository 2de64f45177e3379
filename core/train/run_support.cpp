// The shared header record and progress line (run_support.hpp).
#include "core/train/run_support.hpp"

#include <iomanip>
#include <sstream>

namespace tandem {

nlohmann::json header_record(const HeaderIdentity& identity, const RunConfig& config,
                             const ModelLayout& layout, const std::string& data_prefix,
                             std::int64_t resumed_iteration, const nlohmann::json& extra) {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& tensor : layout.tensors) {
    groups.push_back({{"name", tensor.name},
                      {"shape", tensor.shape},
                      {"numel", tensor.numel},
                      {"group", to_string(tensor.decay_group)}});
  }
  nlohmann::json header = {
      {"type", "header"},
      {"engine", identity.engine},
      {"device", identity.device},
      {"main_precision", identity.main_precision},
      {"compute_precision", identity.compute_precision},
      {"config", config},
      {"data", {{"prefix", data_prefix},
                {"split", config.data.split.empty() ? "all documents train" : config.data.split}}},
      {"parameter_groups",
       {{"decay", {{"elements", layout.elements_in(DecayGroup::decay)},
                   {"weight_decay", config.schedule.weight_decay}}},
        {"no_decay", {{"elements", layout.elements_in(DecayGroup::no_decay)}, {"weight_decay", 0.0}}}}},
      {"tensors", groups},
      {"total_parameters", layout.total_elements},
      {"resumed_from_iteration", resumed_iteration},
      {"build", {{"tandem_version", "0.1.0"}, {"compiler", __VERSION__}}},
  };
  if (!identity.device_description.empty()) header["device_description"] = identity.device_description;
  for (const auto& [key, value] : extra.items()) header[key] = value;
  return header;
}

std::string progress_line(const IterationRecord& record, std::int64_t total_iterations) {
  std::ostringstream line;
  line << "iter " << record.iteration << "/" << total_iterations << " | loss "
       << std::fixed << std::setprecision(4) << record.loss << " | lr " << std::scientific
       << std::setprecision(3) << record.lr << " | grad norm " << record.grad_norm;
  if (record.clipped) line << " (clipped x" << std::fixed << std::setprecision(4) << record.clip_coeff << ")";
  if (!record.update_successful) line << " | SKIPPED (non-finite)";
  line << " | loss tokens " << record.loss_tokens << " | " << std::fixed << std::setprecision(0)
       << record.tokens_per_second << " tok/s";
  if (record.mfu) line << " | MFU " << std::setprecision(1) << 100.0 * *record.mfu << "%";
  return line.str();
}

}  // namespace tandem
