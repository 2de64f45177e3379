// The reference trainer: the exact semantics of one iteration (SPEC 1-8), in the scalar type Real.
//
// It is boring on purpose. Every quantity lives in Real (double, or 50 significant digits for the
// golden numbers); every sum accumulates in Real; data-parallel replicas are emulated in-process,
// each with its own gradient buffer, and reduced in rank order, which is exactly what the
// production reduction across DP ranks must produce. The step (run_iteration) reads as the
// algorithm, one named call per SPEC rule: count loss tokens of the global batch ->
// forward/backward each microbatch of each replica -> reduce over replicas -> loss -> norm ->
// finite check -> clip -> AdamW -> schedule and counters. The test switches and mutants (one
// TestSwitches object, passed in) are consulted only inside those calls, never on a user's run.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "core/train/main_state.hpp"
#include "core/train/records.hpp"

namespace tandem::reference {

// Deliberately wrong variants of the update path ("mutants"), for the equivalence harness's
// negative controls (equivalence/twin.hpp): a harness that cannot tell one of these from the
// reference has a hole. Each names the rule it breaks; all false is the reference.
struct Mutants {
  bool decay_norm_weights = false;               // SPEC 7: weight decay on 1-D / bias tensors too
  bool l2_instead_of_decoupled = false;          // SPEC 7: g += wd*p before Adam, no decoupled term
  bool clip_per_rank = false;                    // SPEC 6: each replica clipped by its own norm
  bool microbatch_mean_under_per_token = false;  // SPEC 5: microbatch-mean scale in per-token mode
  bool eps_inside_sqrt = false;                  // SPEC 7: m_hat / sqrt(v_hat + eps)
  bool bias_correction_off_by_one = false;       // SPEC 7: bias corrections with t + 1
  bool scheduler_advances_on_skip = false;       // SPEC 8: a skipped update advances the schedule
  bool clip_without_epsilon = false;             // SPEC 6: coeff = clip / norm (the 1e-6 dropped)

  bool any() const {
    return decay_norm_weights || l2_instead_of_decoupled || clip_per_rank ||
           microbatch_mean_under_per_token || eps_inside_sqrt || bias_correction_off_by_one ||
           scheduler_advances_on_skip || clip_without_epsilon;
  }
};

// Test-only switches. The default (all empty/false) is the only path a user's run takes.
struct TestSwitches {
  // Iterations (1-based) whose reduced gradient is made non-finite, so skipping is testable end
  // to end: the flat element `nonfinite_gradient_element` is set to `nonfinite_gradient_value`.
  std::set<std::int64_t> nonfinite_gradient_iterations;
  double nonfinite_gradient_value = std::numeric_limits<double>::quiet_NaN();
  std::int64_t nonfinite_gradient_element = 0;
  // Iterations (1-based) whose global loss is replaced by `nonfinite_loss_value` (SPEC 8's other
  // skip condition: a non-finite loss with finite gradients).
  std::set<std::int64_t> nonfinite_loss_iterations;
  double nonfinite_loss_value = std::numeric_limits<double>::quiet_NaN();
  Mutants mutants;  // all false: the reference
};

// Main state: weights, moments and counters, all a checkpoint holds besides the configuration.
template <class Real>
using TrainerState = MainState<Real>;

// The sample at a global index of the training order (SPEC 2): the data path, or a test's own.
using SampleProvider = std::function<Sample(std::int64_t global_index)>;

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

  // Evaluation of the validation split (docs/DATA.md section 12, Megatron's evaluate): `batches`
  // forward-only global batches of `validation`, the first at counters.consumed_valid_samples,
  // each read in SPEC 2's order (microbatch m of replica r takes
  // consumed_valid + m*mbs*DP + r*mbs + [0, mbs)). Loss = the masked CE summed in Real over every
  // position of every batch (microbatches in training's order) / their loss tokens, 0 without
  // any. Advances consumed_valid_samples by batches x GBS; the weights, moments and every other
  // counter stay as they are.
  EvaluationRecord evaluate(const SampleProvider& validation, std::int64_t batches);
  // The last evaluation's loss in Real (before rounding to the record's double).
  const Real& last_evaluation_loss() const { return last_evaluation_loss_; }

  // --audit-params: which flat elements to report in each iteration record.
  void set_audit_elements(std::vector<std::int64_t> elements) { audit_elements_ = std::move(elements); }

  // The reduced main gradient of the last iteration as AdamW used it, i.e. after clipping when
  // the update clipped (the record's grad_norm is the pre-clip norm): [layout.total_elements].
  const std::vector<Real>& last_gradient() const { return reduced_grads_; }
  // The loss of the last iteration in Real (before rounding to the record's double).
  const Real& last_loss() const { return last_loss_; }

 private:
  // One global batch (SPEC 2): [M][DP][mbs] samples, and its token counts (SPEC 5).
  struct GlobalBatch {
    std::vector<std::vector<std::vector<Sample>>> microbatches;
    std::int64_t input_tokens = 0;
    std::int64_t loss_tokens = 0;
    std::int64_t pad_tokens = 0;
  };

  // The step's phases, in order (run_iteration).
  GlobalBatch read_global_batch(std::int64_t consumed) const;                       // SPEC 2, 5
  Real loss_scale(const GlobalBatch& batch, std::int64_t microbatch_loss_tokens) const;  // SPEC 5
  Real forward_backward(const GlobalBatch& batch);                                  // SPEC 5
  void reduce_over_replicas(std::int64_t iteration);                                // SPEC 1
  Real global_loss(const Real& loss_sum, const GlobalBatch& batch, std::int64_t iteration) const;  // SPEC 5
  Real gradient_norm() const;                                                       // SPEC 6
  Real clip(const Real& grad_norm, IterationRecord& record);                        // SPEC 6
  void adamw(std::int64_t step, const Real& lr, const Real& wd, IterationRecord& record);  // SPEC 7
  void count_update(IterationRecord& record, bool successful);                      // SPEC 8, 1

  // The samples of microbatch m on replica r of the global batch that starts after `consumed`
  // samples of `source` (SPEC 2, Megatron's sampler).
  std::vector<Sample> microbatch_samples(const SampleProvider& source, std::int64_t consumed,
                                         std::int64_t microbatch, std::int64_t replica) const;
  void clip_each_replica_mutant();  // test-only: Mutants::clip_per_rank

  RunConfig config_;
  ModelLayout layout_;
  SampleProvider samples_;
  TestSwitches switches_;
  TrainerState<Real> state_;
  std::vector<std::int64_t> audit_elements_;
  std::vector<std::vector<Real>> replica_grads_;  // [DP][total_elements]
  std::vector<Real> reduced_grads_;               // [total_elements]
  Real last_loss_{};
  Real last_evaluation_loss_{};
};

}  // namespace tandem::reference
