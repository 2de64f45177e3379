// The reference trainer: the exact semantics of one iteration (SPEC 1-8), in the scalar type Real.
//
// It is boring on purpose. Every quantity lives in Real (double, or 50 significant digits for the
// golden numbers); every sum accumulates in Real; data-parallel replicas are emulated in-process,
// each with its own gradient buffer, and reduced in rank order, which is exactly what the
// production reduction across DP ranks must produce. The step reads as the algorithm:
// count loss tokens of the global batch -> forward/backward each microbatch of each replica ->
// reduce over replicas -> norm -> finite check -> clip -> AdamW -> schedule -> counters.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "core/train/records.hpp"

namespace tandem::reference {

// Test-only switches. The default (all empty/false) is the only path a user's run takes.
struct TestSwitches {
  // Iterations (1-based) whose reduced gradient is made NaN, so skipping is testable end to end.
  std::set<std::int64_t> nonfinite_gradient_iterations;
};

// Main state: weights, moments and counters, all a checkpoint holds besides the configuration.
template <class Real>
struct TrainerState {
  std::vector<Real> params;      // [layout.total_elements] main weights
  std::vector<Real> exp_avg;     // [layout.total_elements] Adam m
  std::vector<Real> exp_avg_sq;  // [layout.total_elements] Adam v
  Counters counters;
};

// The sample at a global index of the training order (SPEC 2): the data path, or a test's own.
using SampleProvider = std::function<Sample(std::int64_t global_index)>;

// Which parameter elements --audit-params logs: `count` elements chosen by `seed`, alternating
// between the decay and no-decay groups while both have elements (flat indices, sorted).
std::vector<std::int64_t> choose_audit_elements(const ModelLayout& layout, std::int64_t count,
                                                std::uint64_t seed);

template <class Real>
class Trainer {
 public:
  // Initializes the weights from the config's seed (SPEC 4), moments to 0, counters to 0.
  Trainer(const RunConfig& config, SampleProvider samples, TestSwitches switches = {});

  // One iteration: a successful or a skipped update. Fills the record SPEC 12 asks for.
  IterationRecord run_iteration();

  const RunConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  TrainerState<Real>& state() { return state_; }
  const TrainerState<Real>& state() const { return state_; }

  // --audit-params: which flat elements to report in each iteration record.
  void set_audit_elements(std::vector<std::int64_t> elements) { audit_elements_ = std::move(elements); }

  // The reduced, pre-clip main gradient of the last iteration: [layout.total_elements].
  const std::vector<Real>& last_gradient() const { return reduced_grads_; }
  // The loss of the last iteration in Real (before rounding to the record's double).
  const Real& last_loss() const { return last_loss_; }

 private:
  // Global sample indices of microbatch m on replica r (SPEC 2, Megatron's sampler).
  std::vector<Sample> microbatch_samples(std::int64_t microbatch, std::int64_t replica) const;

  RunConfig config_;
  ModelLayout layout_;
  SampleProvider samples_;
  TestSwitches switches_;
  TrainerState<Real> state_;
  std::vector<std::int64_t> audit_elements_;
  std::vector<std::vector<Real>> replica_grads_;  // [DP][total_elements]
  std::vector<Real> reduced_grads_;               // [total_elements]
  Real last_loss_{};
};

}  // namespace tandem::reference
