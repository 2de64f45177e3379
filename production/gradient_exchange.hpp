// The data-parallel exchange of the production trainer (SPEC 1, 6, 13): the fp32 main gradients
// of this rank, the gradient buckets and the ranks' slices of them (sharding.hpp), the reduction
// over replicas, the norm's partial sums, and the distributed optimizer's weight all-gathers,
// with Megatron's overlap of both with the compute on a lane (comm_lane.hpp).
//
// The reduction: a bucket's reduce-scatter sends each owner every other rank's contribution to
// its slice, and the owner adds the DP contributions in rank order 0, 1, ..., DP-1 with its
// backend's fp32 add, a fixed order that depends neither on the transport nor on which rank owns
// an element; so the bucket size and the overlap options change no bit. The replicated optimizer
// then all-gathers each reduced slice.
//
// Overlap (Megatron's options, DP > 1):
//   - --overlap-grad-reduce: during the last microbatch's backward, each bucket's reduce-scatter
//     (and, replicated, its all-gather) goes to the lane as soon as the backward has added its
//     last gradient to every element of it (the model's gradients_done hook);
//   - --overlap-param-gather: the distributed optimizer's all-gather of the updated compute
//     weights is deferred to the next forward, bucket by bucket, each waited for just before the
//     forward first reads weights in it (the model's before_weights hook).
//
// Use, per step: begin_forward_backward(); for each microbatch m, model_hooks(m) around its
// forward/backward; finish_reduction(); then squared_norm() and, after AdamW, publish_weights().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/train/main_state.hpp"
#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"
#include "production/comm_lane.hpp"
#include "production/model.hpp"
#include "production/sharding.hpp"
#include "production/step_hooks.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// Elements of the flat buffer per norm partial sum (SPEC 6): fixed, so the norm's order is too,
// and the alignment of the data-parallel shards (sharding.hpp), so a block never straddles two.
inline constexpr std::int64_t kNormBlockElements = kDataParallelAlignment;

struct ExchangeOptions {
  bool distributed_optimizer = false;  // --use-distributed-optimizer (DP > 1 only)
  bool overlap_grad_reduce = false;    // DP > 1 only
  bool overlap_param_gather = false;   // distributed optimizer only
  std::int64_t bucket_parameters = 0;  // core/config.hpp gradient_bucket_parameters; 0: one bucket
  // Elements at the start of the buffer cut into buckets of their own (gradient_buckets): a tied
  // embedding's copy on the first and the last pipeline stage, so both stages' DP rank r owns the
  // same slices of it and their reduced gradients can be summed slice by slice. 0: none.
  std::int64_t leading_elements = 0;
};

// The global norm's parts (SPEC 6).
struct GradientNorm {
  double sum_of_squares = 0;        // over every element of the buffer, once
  double own_sum_of_squares = 0;    // over this rank's slices only (StepHooks::clip_norm); 0 unless asked
  double global() const;            // sqrt(sum_of_squares)
  double own_slices() const;        // sqrt(own_sum_of_squares)
};

class GradientExchange {
 public:
  GradientExchange() = default;
  // `elements` (N) parameters over the ranks of `replicas`; the hooks' reduction point
  // (adds_replica_contributions) may be null.
  GradientExchange(Backend& backend, std::shared_ptr<Collectives> replicas, std::int64_t elements,
                   const ExchangeOptions& options, std::shared_ptr<const StepHooks> hooks);

  const FlatShards& shards() const { return shards_; }
  Collectives& replicas() const { return *replicas_; }
  bool distributed() const { return distributed_; }
  bool overlaps_grad_reduce() const { return overlap_grad_reduce_; }
  bool overlaps_param_gather() const { return overlap_param_gather_; }
  const char* lane_description() const { return lane_->description(); }
  // The flat ranges whose main state this rank keeps: its slices (distributed), else [0, N).
  std::vector<FlatRange> kept_ranges() const;

  // [padded] fp32 main gradients, accumulated over microbatches; zero padding.
  Buffer<Real>& main_grads() { return main_grads_; }
  const Buffer<Real>& main_grads() const { return main_grads_; }

  // The step's reduction. begin_forward_backward zeroes the gradients and, when the weight
  // gathers were deferred, submits them to the lane; model_hooks(m, M) are microbatch m of M's
  // hooks (the deferred gathers' waits in the first forward, the overlapped reductions in the
  // last backward); finish_reduction drains the lane and reduces what is not reduced yet.
  void begin_forward_backward(ComputeBuffer& compute_weights);
  ModelHooks model_hooks(std::size_t microbatch, std::size_t microbatches);
  void finish_reduction();

  // SPEC 6: the squared norm from fixed-order partial sums: the blocks of each rank's slices,
  // gathered, summed in flat order (bucket, then rank, then block: each element once).
  GradientNorm norm(bool own_slices);

  // The compute weights after the main weights of `kept_ranges()` were written into `compute`
  // at their flat places: with the distributed optimizer every bucket all-gathered now, or, after
  // a step's update with --overlap-param-gather, in the next forward.
  enum class WeightGather { step, now };
  void publish_weights(ComputeBuffer& compute, WeightGather when);
  // The all-gathers --overlap-param-gather deferred, now (evaluation reads every weight).
  void finish_deferred_gathers(ComputeBuffer& compute);

  // The whole flat range [N] of a state buffer that holds kept_ranges() one after another:
  // downloaded when whole on this rank, else the slices all-gathered through a padded scratch.
  std::vector<Real> gather_flat(const Buffer<Real>& kept) const;
  // The main gradients [N], all-gathered from the slices with the distributed optimizer (tests).
  std::vector<Real> gathered_gradients();

 private:
  void reduce_bucket(std::size_t bucket);
  // `mine` (count elements) := the DP contributions in rank order, the others in
  // received_grads_'s rows.
  void sum_in_rank_order(Real* mine, std::int64_t count);
  void gather_bucket(ComputeBuffer& compute, std::size_t bucket);
  // This rank's norm block sums with fp32 accumulators (the StepHooks mutant
  // sums_norm_squares_in_fp32).
  std::vector<double> fp32_norm_blocks() const;

  Backend* backend_ = nullptr;
  std::shared_ptr<Collectives> replicas_;
  std::shared_ptr<const StepHooks> hooks_;
  FlatShards shards_;
  bool distributed_ = false;
  bool overlap_grad_reduce_ = false;
  bool overlap_param_gather_ = false;
  std::unique_ptr<CommLane> lane_;
  Buffer<Real> main_grads_;       // [padded]
  std::int64_t exchange_chunk_ = 0;  // elements of a slice exchanged at once
  Buffer<Real> received_grads_;   // [(DP-1) x exchange_chunk_] the others' contributions
  // [padded / DP / kNormBlockElements] this rank's slices' squared-norm partials, bucket by bucket
  Buffer<double> norm_blocks_;
  bool gather_deferred_ = false;   // --overlap-param-gather: the next forward all-gathers

  // This step's overlap bookkeeping (begin_forward_backward .. finish_reduction).
  ComputeBuffer* step_compute_ = nullptr;     // the weights the deferred gathers fill
  std::vector<CommLane::Ticket> gathered_;    // [buckets] deferred gathers' tickets (0: none)
  std::vector<std::int64_t> unfinished_;      // [buckets] elements the last backward has yet to finish
  std::size_t reduced_ = 0;                   // buckets handed to the lane
};

}  // namespace tandem::production
