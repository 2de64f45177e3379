// Megatron's pipeline schedules for one stage (megatron/core/pipeline_parallel/schedules.py): the
// order of its forward and backward passes over one global batch's microbatches, and the
// point-to-point exchanges between them (stage_exchanges). The trainer (production/trainer.cpp)
// runs both. An exchange between two steps is one call that makes the sends of the step before
// and the receives of the step after, as Megatron's send_forward_recv_backward (non-interleaved)
// and send_forward_backward_recv_forward_backward (interleaved) do, so that no two stages wait on
// each other's sends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline_layout.hpp"

namespace tandem {

struct PipelinePass {
  bool forward = true;          // else the backward
  std::int64_t microbatch = 0;  // in [0, M)
  std::int64_t chunk = 0;       // the model chunk of this rank, in [0, v)
  // Megatron's interleaved steady state: this backward runs right after the forward before it,
  // in one step: the step's receives are made together before the forward, its sends together
  // after the backward. A pass that does not join starts a step of its own.
  bool joins_previous = false;
  bool operator==(const PipelinePass&) const = default;
};

// Non-interleaved 1F1B (Megatron's forward_backward_pipelining_without_interleaving) on stage
// `stage` of `stages`: min(stages - stage - 1, M) warmup forwards, then a forward and a backward
// in turn, then the cooldown backwards. Each stage adds its microbatches' gradients in microbatch
// order, as one stage does.
std::vector<PipelinePass> one_forward_one_backward(std::int64_t stages, std::int64_t stage, std::int64_t microbatches);

// Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving) on stage `stage`
// of `stages` with `chunks` model chunks a stage: Megatron's schedule table (groups of `stages`
// microbatches, its default microbatch_group_size_per_vp_stage; within a group every chunk in
// turn, each over the group's microbatches), (stages - stage - 1) x 2 + (chunks - 1) x stages
// warmup forwards, then a forward and a backward in one step, then the cooldown backwards. The
// backwards take the table with the chunks reversed. Megatron's rule: microbatches a multiple of
// `stages` (interleaved_schedule_problem, core/pipeline_layout.hpp).
std::vector<PipelinePass> interleaved_one_forward_one_backward(std::int64_t stages, std::int64_t stage,
                                                               std::int64_t chunks, std::int64_t microbatches);

// One microbatch at a time: its forward through every chunk of this rank, then its backward
// (chunks in reverse); with forward_only, the forwards alone (evaluation). The schedule for
// several chunks a rank until the interleaved 1F1B is built, and for evaluation.
std::vector<PipelinePass> one_microbatch_at_a_time(std::int64_t chunks, std::int64_t microbatches,
                                                   bool forward_only = false);

// A message of one stage's exchanges: the activation a forward pass takes (or gives) or the
// gradient a backward pass takes (or gives), with the pass that receives it at its peer.
struct StageMessage {
  std::size_t pass = 0;         // this stage's pass that sends it (after running) or receives it
  int peer = -1;                // the stage it goes to or comes from
  bool gradient = false;        // a backward's gradient, else a forward's activation
  std::int64_t microbatch = 0;  // of the receiving pass
  std::int64_t chunk = 0;       // of the receiving pass
  bool operator==(const StageMessage&) const = default;
};

// One call of Collectives::exchange_with_peers, made before passes[before] (passes.size(): after
// the last pass): the sends of the step before it, then the receives of the step it precedes,
// each in pass order.
struct StageExchange {
  std::size_t before = 0;
  std::vector<StageMessage> sends;
  std::vector<StageMessage> receives;
};

// The exchanges of stage `stage` of `stages` (chunks of this rank: `chunks`) running `passes`.
// The virtual stages run chunk-major: chunk c of stage s takes its input from chunk c of stage
// s - 1, chunk c of stage 0 from chunk c - 1 of the last stage; the first virtual stage receives
// no activation, the last no gradient. Steps are the passes joined by joins_previous.
std::vector<StageExchange> stage_exchanges(const std::vector<PipelinePass>& passes, std::int64_t stages,
                                           std::int64_t stage, std::int64_t chunks);

// The most microbatches whose activations `passes` holds at once (forwarded, not yet backward):
// the activation slots it needs. Microbatch m uses slot m % that number (the microbatches in
// flight are always consecutive).
std::int64_t microbatches_in_flight(const std::vector<PipelinePass>& passes);

// Where each pass keeps its model chunk's activations: a forward takes the lowest free chunk slot
// and its microbatch's backward of the same chunk frees it (a forward with no backward in `passes`,
// evaluation's, frees it at once). `count` is the most in use at once: the (microbatch, chunk)
// pairs in flight, Megatron's warmup + 1 (Korthikanti et al.'s count for the interleaved
// schedule), which a slot per microbatch holding all its chunks would exceed.
struct ChunkSlots {
  std::vector<std::int64_t> of_pass;  // [passes] the chunk slot each pass uses
  std::int64_t count = 1;
};
ChunkSlots chunk_activation_slots(const std::vector<PipelinePass>& passes);

// "F0 F1 B0 F2 B1 B2" (chunks as F0.1 when there are several; a joined step as F2.0+B0.1), for
// tests and messages.
std::string describe(const std::vector<PipelinePass>& passes);

}  // namespace tandem
