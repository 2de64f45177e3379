// The production trainer's pipeline passes (trainer.hpp): the schedule of this stage's passes,
// their run with the stage-to-stage exchanges between them, and the --pipeline-timeline record of
// when each pass ran.
#include "production/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<PipelinePass> Trainer::training_passes() const {
  const std::int64_t microbatches = config_.microbatches_per_replica();
  if (split_.pipeline_size() == 1) return one_microbatch_at_a_time(1, microbatches);
  if (stages_->virtual_stages() == 1) {
    return one_forward_one_backward(split_.pipeline_size(), split_.pipeline_stage(), microbatches);
  }
  return interleaved_one_forward_one_backward(split_.pipeline_size(), split_.pipeline_stage(),
                                              stages_->virtual_stages(), microbatches);
}

void Trainer::run_passes(const std::vector<PipelinePass>& passes,
                         const PassBody& pass_body, std::vector<TimedPass>* timings) {
  const std::int64_t slots = model_->activation_slots();
  const ChunkSlots chunk_slots = chunk_activation_slots(passes);
  if (chunk_slots.count > model_->chunk_slots()) {
    throw std::logic_error("the schedule keeps " + std::to_string(chunk_slots.count) + " model chunks' activations at once; the model has " +
                           std::to_string(model_->chunk_slots()) + " chunk slots");
  }
  if (split_.pipeline_size() == 1) {
    for (std::size_t i = 0; i < passes.size(); ++i) {
      pass_body(passes[i], passes[i].microbatch % slots, chunk_slots.of_pass[i]);
    }
    return;
  }
  // Each exchange sends from slots of outgoing_ (a pass's output copied there when it has run, so
  // that the next pass may overwrite the stream) and receives into slots of incoming_ (copied
  // into the stream just before the pass that takes it).
  const std::int64_t bytes = model_->stream_bytes();
  const std::vector<StageExchange> exchanges =
      stage_exchanges(passes, split_.pipeline_size(), split_.pipeline_stage(), stages_->virtual_stages());
  std::vector<std::int64_t> sent_from(passes.size(), -1);  // pass -> outgoing slot
  std::vector<std::int64_t> taken_from(passes.size(), -1);  // pass -> incoming slot
  for (const StageExchange& exchange : exchanges) {
    for (std::size_t k = 0; k < exchange.sends.size(); ++k) sent_from[exchange.sends[k].pass] = static_cast<std::int64_t>(k);
    for (std::size_t k = 0; k < exchange.receives.size(); ++k) {
      taken_from[exchange.receives[k].pass] = static_cast<std::int64_t>(k);
    }
  }
  const auto run_exchange = [&](const StageExchange& exchange) {
    PeerExchange peers;
    for (std::size_t k = 0; k < exchange.sends.size(); ++k) {
      peers.sends.push_back({outgoing_.at(static_cast<std::int64_t>(k) * bytes), bytes, exchange.sends[k].peer});
    }
    for (std::size_t k = 0; k < exchange.receives.size(); ++k) {
      peers.receives.push_back({incoming_.at(static_cast<std::int64_t>(k) * bytes), bytes, exchange.receives[k].peer});
    }
    pipeline_group_->exchange_with_peers(peers);
  };
  auto exchange = exchanges.begin();
  for (std::size_t i = 0; i < passes.size(); ++i) {
    const PipelinePass& pass = passes[i];
    if (exchange != exchanges.end() && exchange->before == i) run_exchange(*exchange++);
    if (taken_from[i] != -1) {
      backend_->copy(pass.forward ? model_->stream() : model_->stream_grad(), incoming_.at(taken_from[i] * bytes), bytes);
    }
    if (timings != nullptr) {  // the pass's work done when its stream is: the backend synchronized
      const double start = seconds_since(timing_start_);
      pass_body(pass, pass.microbatch % slots, chunk_slots.of_pass[i]);
      backend_->synchronize();
      timings->push_back({pass, start, seconds_since(timing_start_)});
    } else {
      pass_body(pass, pass.microbatch % slots, chunk_slots.of_pass[i]);
    }
    if (sent_from[i] != -1) {
      backend_->copy(outgoing_.at(sent_from[i] * bytes), pass.forward ? model_->stream() : model_->stream_grad(), bytes);
    }
  }
  if (exchange != exchanges.end()) run_exchange(*exchange++);
}

PipelineTimeline Trainer::gather_timeline(std::int64_t iteration, const std::vector<TimedPass>& mine) const {
  // [forward, microbatch, chunk, start, end] per pass: every stage runs v x 2M passes.
  std::vector<double> packed;
  for (const TimedPass& timed : mine) {
    packed.insert(packed.end(), {timed.pass.forward ? 1.0 : 0.0, static_cast<double>(timed.pass.microbatch),
                                 static_cast<double>(timed.pass.chunk), timed.start, timed.end});
  }
  const std::vector<double> all = all_gather_values(*pipeline_group_, packed);
  PipelineTimeline timeline;
  timeline.iteration = iteration;
  timeline.stages.resize(static_cast<std::size_t>(split_.pipeline_size()));
  for (std::size_t stage = 0; stage < timeline.stages.size(); ++stage) {
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const double* fields = all.data() + (stage * mine.size() + i) * 5;
      PipelinePass pass{fields[0] != 0.0, static_cast<std::int64_t>(fields[1]), static_cast<std::int64_t>(fields[2])};
      timeline.stages[stage].push_back({pass, fields[3], fields[4]});
    }
  }
  return timeline;
}

double PipelineTimeline::span() const {
  double span = 0.0;
  for (const auto& passes : stages) {
    for (const TimedPass& timed : passes) span = std::max(span, timed.end);
  }
  return span;
}

double PipelineTimeline::busy(std::size_t stage) const {
  double busy = 0.0;
  for (const TimedPass& timed : stages.at(stage)) busy += timed.end - timed.start;
  return busy;
}

double PipelineTimeline::idle_fraction() const {
  const double whole = span() * static_cast<double>(stages.size());
  if (whole <= 0.0) return 0.0;
  double idle = 0.0;
  for (std::size_t stage = 0; stage < stages.size(); ++stage) idle += span() - busy(stage);
  return idle / whole;
}

}  // namespace tandem::production
