// Megatron's pipeline schedules (pipeline_schedule.hpp).
#include "core/pipeline_schedule.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <set>
#include <stdexcept>

namespace tandem {

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

std::vector<PipelinePass> interleaved_one_forward_one_backward(std::int64_t stages, std::int64_t stage,
                                                               std::int64_t chunks, std::int64_t microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || chunks < 1 || microbatches < 1) {
    throw std::invalid_argument("interleaved_one_forward_one_backward: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + ", " + std::to_string(chunks) + " chunks, " +
                                std::to_string(microbatches) + " microbatches");
  }
  if (const std::string problem = interleaved_schedule_problem(stages, microbatches); !problem.empty()) {
    throw std::invalid_argument("interleaved_one_forward_one_backward: " + problem);
  }
  // Megatron's get_schedule_table: virtual microbatch k -> (microbatch, chunk), groups of
  // `stages` microbatches, the last group taking what is left.
  const std::int64_t group = stages;
  std::vector<std::pair<std::int64_t, std::int64_t>> table;
  for (std::int64_t first = 0; first < microbatches; first += group) {
    const std::int64_t end = first + group >= microbatches ? microbatches : first + group;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      for (std::int64_t m = first; m < end; ++m) table.emplace_back(m, chunk);
    }
  }
  const auto total = static_cast<std::int64_t>(table.size());
  // get_pp_rank_microbatches: every virtual microbatch in warmup when there are no more.
  const std::int64_t warmup = std::min((stages - stage - 1) * 2 + (chunks - 1) * group, total);
  const auto forward = [&](std::int64_t k) {
    const auto& [m, chunk] = table[static_cast<std::size_t>(k)];
    return PipelinePass{true, m, chunk, false};
  };
  // A chunk's backwards take its forwards' microbatches in order (Megatron pops its oldest input).
  const auto backward = [&](std::int64_t k, bool joins) {
    const auto& [m, chunk] = table[static_cast<std::size_t>(k)];
    return PipelinePass{false, m, chunks - 1 - chunk, joins};
  };
  std::vector<PipelinePass> passes;
  for (std::int64_t k = 0; k < warmup; ++k) passes.push_back(forward(k));
  for (std::int64_t k = 0; k < total - warmup; ++k) {
    passes.push_back(forward(warmup + k));
    passes.push_back(backward(k, true));
  }
  for (std::int64_t k = total - warmup; k < total; ++k) passes.push_back(backward(k, false));
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

std::vector<StageExchange> stage_exchanges(const std::vector<PipelinePass>& passes, std::int64_t stages,
                                           std::int64_t stage, std::int64_t chunks) {
  if (stages < 1 || stage < 0 || stage >= stages || chunks < 1) {
    throw std::invalid_argument("stage_exchanges: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                                ", " + std::to_string(chunks) + " chunks");
  }
  const std::int64_t last_virtual_stage = stages * chunks - 1;
  const auto virtual_stage = [&](std::int64_t chunk) { return chunk * stages + stage; };
  const int previous = static_cast<int>(stage > 0 ? stage - 1 : stages - 1);
  const int next = static_cast<int>(stage + 1 < stages ? stage + 1 : 0);
  const auto receive = [&](std::size_t i) -> std::optional<StageMessage> {
    const PipelinePass& pass = passes[i];
    if (pass.forward && virtual_stage(pass.chunk) != 0) {
      return StageMessage{i, previous, false, pass.microbatch, pass.chunk};
    }
    if (!pass.forward && virtual_stage(pass.chunk) != last_virtual_stage) {
      return StageMessage{i, next, true, pass.microbatch, pass.chunk};
    }
    return std::nullopt;
  };
  const auto send = [&](std::size_t i) -> std::optional<StageMessage> {
    const PipelinePass& pass = passes[i];
    if (pass.forward && virtual_stage(pass.chunk) != last_virtual_stage) {
      return StageMessage{i, next, false, pass.microbatch, stage + 1 < stages ? pass.chunk : pass.chunk + 1};
    }
    if (!pass.forward && virtual_stage(pass.chunk) != 0) {
      return StageMessage{i, previous, true, pass.microbatch, stage > 0 ? pass.chunk : pass.chunk - 1};
    }
    return std::nullopt;
  };
  std::vector<StageExchange> exchanges;
  std::vector<StageMessage> pending;  // the sends of the step before
  for (std::size_t first = 0; first < passes.size();) {
    if (first == 0 && passes[0].joins_previous) {
      throw std::invalid_argument("stage_exchanges: the first pass joins no pass before it");
    }
    std::size_t end = first + 1;
    while (end < passes.size() && passes[end].joins_previous) ++end;
    StageExchange exchange{first, std::move(pending), {}};
    pending = {};
    for (std::size_t i = first; i < end; ++i) {
      if (auto message = receive(i)) exchange.receives.push_back(*message);
      if (auto message = send(i)) pending.push_back(*message);
    }
    if (!exchange.sends.empty() || !exchange.receives.empty()) exchanges.push_back(std::move(exchange));
    first = end;
  }
  if (!pending.empty()) exchanges.push_back(StageExchange{passes.size(), std::move(pending), {}});
  return exchanges;
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

ChunkSlots chunk_activation_slots(const std::vector<PipelinePass>& passes) {
  std::set<std::pair<std::int64_t, std::int64_t>> backwards;  // (microbatch, chunk)
  for (const PipelinePass& pass : passes) {
    if (!pass.forward) backwards.emplace(pass.microbatch, pass.chunk);
  }
  ChunkSlots slots;
  slots.of_pass.assign(passes.size(), 0);
  std::set<std::int64_t> free_slots;
  std::int64_t used = 0;  // slots ever handed out
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> holding;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    const PipelinePass& pass = passes[i];
    const std::pair key{pass.microbatch, pass.chunk};
    if (pass.forward) {
      std::int64_t slot = used;
      if (free_slots.empty()) {
        ++used;
      } else {
        slot = *free_slots.begin();
        free_slots.erase(free_slots.begin());
      }
      slots.of_pass[i] = slot;
      if (backwards.contains(key)) {
        holding[key] = slot;
      } else {
        free_slots.insert(slot);
      }
    } else {
      const auto held = holding.find(key);
      if (held == holding.end()) {
        throw std::invalid_argument("chunk_activation_slots: the backward of microbatch " +
                                    std::to_string(pass.microbatch) + " chunk " + std::to_string(pass.chunk) +
                                    " comes before its forward");
      }
      slots.of_pass[i] = held->second;
      free_slots.insert(held->second);
      holding.erase(held);
    }
  }
  slots.count = std::max<std::int64_t>(1, used);
  return slots;
}

std::string describe(const std::vector<PipelinePass>& passes) {
  const bool chunked = std::any_of(passes.begin(), passes.end(), [](const PipelinePass& p) { return p.chunk > 0; });
  std::string out;
  for (const PipelinePass& pass : passes) {
    if (!out.empty()) out += pass.joins_previous ? '+' : ' ';
    out += (pass.forward ? "F" : "B") + std::to_string(pass.microbatch) +
           (chunked ? "." + std::to_string(pass.chunk) : "");
  }
  return out;
}

}  // namespace tandem
