// The test hooks (step_hooks.hpp): injected faults and the production-side mutants.
#include "production/step_hooks.hpp"

#include <cmath>

#include "core/config.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

class TestHooks final : public StepHooks {
 public:
  TestHooks(FaultSchedule faults, ProductionMutants mutants) : faults_(std::move(faults)), mutants_(mutants) {}

  std::int64_t loss_denominator(std::int64_t global_loss_tokens, std::int64_t rank_loss_tokens) const override {
    return mutants_.rank_local_loss_denominator ? rank_loss_tokens : global_loss_tokens;
  }
  bool adds_replica_contributions() const override { return !mutants_.unreduced_gradients; }
  void after_reduction(std::int64_t iteration, const ReducedGradient& gradient) const override {
    if (faults_.nonfinite_gradient_iterations.count(iteration) != 0) gradient.set(0, std::nanf(""));
  }
  double loss(std::int64_t iteration, double loss) const override {
    return faults_.nonfinite_loss_iterations.count(iteration) != 0 ? faults_.nonfinite_loss_value : loss;
  }
  double clip_norm(double global_norm, double own_slices_norm) const override {
    if (mutants_.clip_without_epsilon) return global_norm - kClipNormEpsilon;  // clip / (norm - eps + eps)
    return mutants_.shard_local_norm ? own_slices_norm : global_norm;
  }
  double adam_epsilon(double eps, double bias_correction2) const override {
    return mutants_.adam_epsilon_scaled_by_bias_correction ? eps * std::sqrt(bias_correction2) : eps;
  }
  bool wants_own_slices_norm() const override { return mutants_.shard_local_norm; }
  bool rounds_main_gradients_to_bf16_between_microbatches() const override {
    return mutants_.bf16_main_gradients_between_microbatches;
  }
  bool sums_norm_squares_in_fp32() const override { return mutants_.norm_squares_summed_in_fp32; }
  bool sums_sequence_parallel_gradients() const override { return !mutants_.unsummed_sequence_parallel_gradients; }
  bool counts_replicated_once() const override { return !mutants_.replicated_counted_per_rank; }
  bool normalizes_over_whole_vocabulary() const override { return !mutants_.local_vocabulary_normalizer; }
  int row_parallel_sums() const override {
    return mutants_.row_parallel_not_summed ? 0 : mutants_.row_parallel_summed_twice ? 2 : 1;
  }
  bool sums_tied_embedding_gradients() const override { return !mutants_.tied_embedding_not_summed; }
  bool counts_tied_embedding_once() const override { return !mutants_.tied_embedding_counted_twice; }
  bool sums_norm_over_stages() const override { return !mutants_.stage_local_norm; }
  std::int64_t sent_microbatch(std::int64_t microbatch, std::int64_t microbatches) const override {
    return mutants_.microbatches_out_of_order ? (microbatch + 1) % microbatches : microbatch;
  }
  Real last_stage_loss_scale(Real scale, std::int64_t microbatch_loss_tokens) const override {
    if (mutants_.loss_scale_one_part_in_a_billion) return static_cast<Real>(scale * (1.0 + 1e-9));
    if (!mutants_.last_stage_microbatch_loss) return scale;
    return microbatch_loss_tokens > 0 ? static_cast<Real>(1.0 / static_cast<double>(microbatch_loss_tokens)) : 0.0f;
  }

 private:
  FaultSchedule faults_;
  ProductionMutants mutants_;
};

}  // namespace

std::shared_ptr<const StepHooks> make_test_hooks(const FaultSchedule& faults, const ProductionMutants& mutants) {
  const bool no_faults = faults.nonfinite_gradient_iterations.empty() && faults.nonfinite_loss_iterations.empty();
  const bool no_mutants = !mutants.unreduced_gradients && !mutants.rank_local_loss_denominator &&
                          !mutants.shard_local_norm && !mutants.bf16_main_gradients_between_microbatches &&
                          !mutants.unsummed_sequence_parallel_gradients &&
                          !mutants.replicated_counted_per_rank && !mutants.local_vocabulary_normalizer &&
                          !mutants.row_parallel_summed_twice && !mutants.row_parallel_not_summed &&
                          !mutants.tied_embedding_not_summed && !mutants.tied_embedding_counted_twice &&
                          !mutants.stage_local_norm && !mutants.microbatches_out_of_order &&
                          !mutants.last_stage_microbatch_loss && !mutants.clip_without_epsilon &&
                          !mutants.adam_epsilon_scaled_by_bias_correction &&
                          !mutants.loss_scale_one_part_in_a_billion && !mutants.norm_squares_summed_in_fp32;
  if (no_faults && no_mutants) return nullptr;
  return std::make_shared<TestHooks>(faults, mutants);
}

}  // namespace tandem::production
