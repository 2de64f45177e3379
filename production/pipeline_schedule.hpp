// Megatron's pipeline schedules for one stage (megatron/core/pipeline_parallel/schedules.py): the
// order of its forward and backward passes over one global batch's microbatches. The trainer
// (production/trainer.cpp) runs them, with the point-to-point exchange between two passes fused
// into one call (what the pass before sends, what the pass after receives), as Megatron's
// send_forward_recv_backward and send_backward_recv_forward do, so that no two stages wait on
// each other's sends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::production {

struct PipelinePass {
  bool forward = true;          // else the backward
  std::int64_t microbatch = 0;  // in [0, M)
  std::int64_t chunk = 0;       // the model chunk of this rank, in [0, v)
  bool operator==(const PipelinePass&) const = default;
};

// Non-interleaved 1F1B (Megatron's forward_backward_pipelining_without_interleaving) on stage
// `stage` of `stages`: min(stages - stage - 1, M) warmup forwards, then a forward and a backward
// in turn, then the cooldown backwards. Each stage adds its microbatches' gradients in microbatch
// order, as one stage does.
std::vector<PipelinePass> one_forward_one_backward(std::int64_t stages, std::int64_t stage, std::int64_t microbatches);

// One microbatch at a time: its forward through every chunk of this rank, then its backward
// (chunks in reverse); with forward_only, the forwards alone (evaluation). The schedule for
// several chunks a rank until the interleaved 1F1B is built, and for evaluation.
std::vector<PipelinePass> one_microbatch_at_a_time(std::int64_t chunks, std::int64_t microbatches,
                                                   bool forward_only = false);

// The most microbatches whose activations `passes` holds at once (forwarded, not yet backward):
// the activation slots it needs. Microbatch m uses slot m % that number (the microbatches in
// flight are always consecutive).
std::int64_t microbatches_in_flight(const std::vector<PipelinePass>& passes);

// "F0 F1 B0 F2 B1 B2" (chunks as F0.1 when there are several), for tests and messages.
std::string describe(const std::vector<PipelinePass>& passes);

}  // namespace tandem::production
