// Where injected faults and the equivalence harness's negative controls enter the production
// step (production/trainer.hpp): one object, passed in through ProductionOptions::hooks, with one
// virtual function per hook point. The base class is the identity at every point; a user's run
// has no hooks object, so every point is the identity. The step calls each point exactly where
// its comment says, so a fault or a mutant never becomes a branch inside the numbered steps.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include "production/arithmetic.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// Write access to one rank's reduced main gradient, for after_reduction: set(flat, value) stores
// `value` at flat element `flat` when this rank keeps it (a no-op elsewhere).
struct ReducedGradient {
  std::function<void(std::int64_t flat, Real value)> set;
};

class StepHooks {
 public:
  virtual ~StepHooks() = default;

  // SPEC 5: the per-token denominator this rank scales its loss by, from the global batch's loss
  // tokens and this rank's own.
  virtual std::int64_t loss_denominator(std::int64_t global_loss_tokens, std::int64_t /*rank_loss_tokens*/) const {
    return global_loss_tokens;
  }
  // SPEC 1: whether the owner of a gradient slice adds the other replicas' contributions to its
  // own.
  virtual bool adds_replica_contributions() const { return true; }
  // After the reduction over replicas, before the loss and the norm of iteration `iteration`.
  virtual void after_reduction(std::int64_t /*iteration*/, const ReducedGradient& /*gradient*/) const {}
  // SPEC 5/8: the global loss of iteration `iteration` as the step goes on with it.
  virtual double loss(std::int64_t /*iteration*/, double loss) const { return loss; }
  // SPEC 6: the norm the clip coefficient divides by, given the global norm and the norm of this
  // rank's own slices (the skip decision always takes the global norm, so every rank makes the
  // same collective calls whatever this returns).
  virtual double clip_norm(double global_norm, double /*own_slices_norm*/) const { return global_norm; }
  // SPEC 7: the epsilon AdamW adds to sqrt(v_hat) at a step whose 1 - b2^t is `bias_correction2`.
  virtual double adam_epsilon(double eps, double /*bias_correction2*/) const { return eps; }
  // Whether clip_norm wants own_slices_norm (which costs a download): false for the identity.
  virtual bool wants_own_slices_norm() const { return false; }
  // SPEC 7: whether the main gradients are rounded to bf16 after each microbatch's backward but the
  // last (as if they were held in bf16); false: they stay fp32 across microbatches.
  virtual bool rounds_main_gradients_to_bf16_between_microbatches() const { return false; }
  // SPEC 6: whether each block of the norm's squares is summed in fp32 (a float accumulator);
  // false: in double, each square of an fp32 value exact (kernels/optimizer_host.cpp).
  virtual bool sums_norm_squares_in_fp32() const { return false; }

  // Tensor parallelism (production/model.hpp, trainer_gradients.cpp):
  // whether the replicated tensors' partial gradients are summed over TP under sequence parallelism;
  virtual bool sums_sequence_parallel_gradients() const { return true; }
  // whether the norm counts a replicated tensor on TP rank 0 only (else on every TP rank);
  virtual bool counts_replicated_once() const { return true; }
  // whether the cross-entropy's normalizer sums every TP rank's part of the vocabulary;
  virtual bool normalizes_over_whole_vocabulary() const { return true; }
  // how many times a row-parallel layer's output is summed over TP (1: once).
  virtual int row_parallel_sums() const { return 1; }

  // Pipeline parallelism with tied embeddings (trainer_gradients.cpp):
  // whether the first and last stage's embedding gradients are summed over the embedding group;
  virtual bool sums_tied_embedding_gradients() const { return true; }
  // whether the norm counts the tied embedding on the first stage only (else on both).
  virtual bool counts_tied_embedding_once() const { return true; }
  // Pipeline parallelism (trainer.cpp, trainer_gradients.cpp):
  // whether the norm sums every stage's squares (else each stage has its own norm);
  virtual bool sums_norm_over_stages() const { return true; }
  // the microbatch whose samples a stage that is not the last begins where the schedule says
  // `microbatch` of `microbatches` (the identity: its activations reach the next stage in order);
  virtual std::int64_t sent_microbatch(std::int64_t microbatch, std::int64_t /*microbatches*/) const {
    return microbatch;
  }
  // the last stage's loss scale of a microbatch with `microbatch_loss_tokens`, given SPEC 5's.
  virtual Real last_stage_loss_scale(Real scale, std::int64_t /*microbatch_loss_tokens*/) const { return scale; }
};

// Faults a test injects into a correct run (SPEC 8's skip conditions), as the reference's
// switches do (reference/trainer.hpp).
struct FaultSchedule {
  // Iterations (1-based) whose reduced gradient is made NaN at flat element 0.
  std::set<std::int64_t> nonfinite_gradient_iterations;
  // Iterations (1-based) whose global loss is replaced by `nonfinite_loss_value` on every rank.
  std::set<std::int64_t> nonfinite_loss_iterations;
  double nonfinite_loss_value = std::numeric_limits<double>::quiet_NaN();
};

// Deliberately wrong data-parallel variants, for the equivalence harness's negative controls
// (equivalence/twin.hpp Mutant): each is a classic multi-rank bug the harness must catch.
struct ProductionMutants {
  bool unreduced_gradients = false;          // each rank updates with its own gradient only
  bool rank_local_loss_denominator = false;  // per-token: divide by this rank's loss tokens
  bool shard_local_norm = false;             // clip by this rank's shard's norm, not the global one
  // A precision bug (any parallelism): the main gradients rounded to bf16 between microbatches.
  bool bf16_main_gradients_between_microbatches = false;
  // A precision bug of a few fp32 roundings (any parallelism), which only the statistical bounds
  // see in fp32 (equivalence/statistical_bounds.hpp): the norm's squares summed in fp32.
  bool norm_squares_summed_in_fp32 = false;
  // Semantic bugs of about one part in a million (any parallelism), which only the semantic twin's
  // bounds see (production/arithmetic.hpp):
  bool clip_without_epsilon = false;  // SPEC 6's coefficient as clip / norm (the 1e-6 dropped)
  // eps * sqrt(1 - b2^t) in place of eps: the Adam paper's "efficient" form, where eps is added
  // before the bias correction of v.
  bool adam_epsilon_scaled_by_bias_correction = false;
  // The loss scale (1 + 1e-9) times SPEC 5's: a denominator one token in a billion short. fp32
  // cannot even hold it (the scale rounds back); the semantic twin must see it.
  bool loss_scale_one_part_in_a_billion = false;
  // Tensor-parallel bugs (TP > 1):
  bool unsummed_sequence_parallel_gradients = false;  // norm weights' partial gradients not summed over TP
  bool replicated_counted_per_rank = false;   // a replicated tensor counted TP times in the norm
  bool local_vocabulary_normalizer = false;   // cross-entropy normalized over the local vocabulary part
  bool row_parallel_summed_twice = false;     // a row-parallel output summed over TP twice
  bool row_parallel_not_summed = false;       // ... or not at all
  // Pipeline-parallel bugs (PP > 1, tied embeddings):
  bool tied_embedding_not_summed = false;     // each stage updates its copy with its own gradient
  bool tied_embedding_counted_twice = false;  // both copies counted in the norm
  // Pipeline-parallel bugs (PP > 1):
  bool stage_local_norm = false;             // each stage clips by (and reports) its own stage's norm
  bool microbatches_out_of_order = false;    // the first stages feed microbatch m + 1 where m is due
  bool last_stage_microbatch_loss = false;   // the last stage scales a microbatch by 1 / its own loss tokens
};

// The hooks that inject `faults` and switch on `mutants`; null when both are empty.
std::shared_ptr<const StepHooks> make_test_hooks(const FaultSchedule& faults, const ProductionMutants& mutants = {});

}  // namespace tandem::production
