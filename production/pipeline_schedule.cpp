// Megatron's pipeline schedules (pipeline_schedule.hpp).
#include "production/pipeline_schedule.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace tandem::production {

std::vector<PipelinePass> one_forward_one_backward(std::int64_t stages, std::int64_t stage, std::int64_t microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1) {
    throw std::invalid_argument("one_forward_one_backward: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + ", " + std::to_string(microbatches) + " microbatches");
  }
  // Megatron: num_warmup_microbatches = min(pipeline size - rank - 1, microbatches).
  const std::int64_t warmup = std::min(stages - stage - 1, microbatches);
  const std::int64_t steady = microbatches - warmup;
  std::vector<PipelinePass> passes;
  for (std::int64_t m = 0; m < warmup; ++m) passes.push_back({true, m, 0});
  for (std::int64_t i = 0; i < steady; ++i) {
    passes.push_back({true, warmup + i, 0});
    passes.push_back({false, i, 0});
  }
  for (std::int64_t m = steady; m < microbatches; ++m) passes.push_back({false, m, 0});
  return passes;
}

std::vector<PipelinePass> one_microbatch_at_a_time(std::int64_t chunks, std::int64_t microbatches, bool forward_only) {
  std::vector<PipelinePass> passes;
  for (std::int64_t m = 0; m < microbatches; ++m) {
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) passes.push_back({true, m, chunk});
    if (forward_only) continue;
    for (std::int64_t chunk = chunks; chunk-- > 0;) passes.push_back({false, m, chunk});
  }
  return passes;
}

std::int64_t microbatches_in_flight(const std::vector<PipelinePass>& passes) {
  std::set<std::int64_t> in_flight;
  std::size_t most = 0;
  for (const PipelinePass& pass : passes) {
    if (pass.forward) {
      in_flight.insert(pass.microbatch);
    } else if (pass.chunk == 0) {  // its last backward pass: its activations are free
      most = std::max(most, in_flight.size());
      in_flight.erase(pass.microbatch);
    }
    most = std::max(most, in_flight.size());
  }
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(most));
}

std::string describe(const std::vector<PipelinePass>& passes) {
  const bool chunked = std::any_of(passes.begin(), passes.end(), [](const PipelinePass& p) { return p.chunk > 0; });
  std::string out;
  for (const PipelinePass& pass : passes) {
    if (!out.empty()) out += ' ';
    out += (pass.forward ? "F" : "B") + std::to_string(pass.microbatch) +
           (chunked ? "." + std::to_string(pass.chunk) : "");
  }
  return out;
}

}  // namespace tandem::production
