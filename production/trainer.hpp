// The production trainer: the fast twin of reference/trainer.hpp. The same iteration (SPEC 1-8),
// the same IterationRecord and audit entries, on a Backend (cuda, or cpu for CI), with SPEC 7's
// production state: fp32 main weights, fp32 main gradients accumulated over microbatches, fp32 m
// and v, and a bf16 compute copy of the weights with --bf16.
//
// Data parallel (DP ranks, one Trainer per rank, exchanging through production/collectives/):
// rank r reads its own microbatches (SPEC 2) and accumulates its fp32 main gradients. The flat
// buffer is cut into gradient buckets, and rank r owns slice r of each (sharding.hpp; one bucket
// without --overlap-grad-reduce). A bucket's reduce-scatter sends each owner every other rank's
// contribution to its slice, and the owner adds the DP contributions in rank order 0, 1, ...,
// DP-1 with its backend's fp32 add: a fixed order that depends neither on the transport nor on
// which rank owns an element, so the bucket size and the overlap options change no bit.
// The norm sums fixed blocks in flat order, each inside one slice. Then either
//   - the distributed optimizer (--use-distributed-optimizer, Megatron's): each rank keeps only
//     its slices of the main weights, m and v, runs AdamW on them and all-gathers the compute
//     weights bucket by bucket; or
//   - the replicated optimizer (Megatron's default): each reduced bucket is all-gathered and every
//     rank runs AdamW over the whole buffer.
// Both compute every element with the same operations on the same inputs: their states are
// bitwise equal (tests/production_data_parallel_test.cpp).
//
// Overlap (Megatron's options, DP > 1), through a lane beside the compute (comm_lane.hpp):
//   - --overlap-grad-reduce: during the last microbatch's backward, each bucket's reduce-scatter
//     (and, replicated, its all-gather) starts as soon as the backward has added its last
//     gradient to every element of it;
//   - --overlap-param-gather: the distributed optimizer's all-gather of the updated compute
//     weights is deferred to the next forward, bucket by bucket, each waited for just before the
//     forward first reads weights in it.
// The exchanges and the sums are the same, in the same order: the results are bitwise those of
// the run without overlap.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "core/train/main_state.hpp"
#include "core/train/records.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"
#include "production/comm_lane.hpp"
#include "production/model.hpp"
#include "production/sharding.hpp"

namespace tandem::production {

// Test-only switches. The default (all empty) is the only path a user's run takes.
struct TestSwitches {
  // Iterations (1-based) whose reduced gradient is made NaN at flat element 0 (SPEC 8 tests), as
  // the reference's switch does.
  std::set<std::int64_t> nonfinite_gradient_iterations;
  // Iterations (1-based) whose global loss is replaced by `nonfinite_loss_value` on every rank
  // (SPEC 8's other skip condition), as the reference's switch does.
  std::set<std::int64_t> nonfinite_loss_iterations;
  double nonfinite_loss_value = std::numeric_limits<double>::quiet_NaN();
  // Deliberately wrong data-parallel variants, for the equivalence harness's negative controls
  // (equivalence/twin.hpp Mutant): each is a classic multi-rank bug the harness must catch.
  struct Mutants {
    bool unreduced_gradients = false;      // each rank updates with its own gradient only
    bool rank_local_loss_denominator = false;  // per-token: divide by this rank's loss tokens
    bool shard_local_norm = false;         // clip by this rank's shard's norm, not the global one
  } mutants;
};

// This rank's collectives, made once its backend exists (NCCL needs the backend's stream).
using CollectivesFactory = std::function<std::shared_ptr<Collectives>(Backend& backend)>;

struct ProductionOptions {
  Device device = Device::cpu;
  int device_index = 0;                // cuda device of this rank (its local rank)
  std::int64_t logits_chunk_rows = 0;  // fused cross-entropy chunk; 0 = DecoderModel's default
  CollectivesFactory collectives;      // empty: one rank; else size() must equal DP
  TestSwitches switches;
};

// The main state on the host, as a checkpoint holds it (fp32, SPEC 9).
using HostState = MainState<float>;

using SampleProvider = std::function<Sample(std::int64_t global_index)>;

// Elements of the flat buffer per norm partial sum (SPEC 6): fixed, so the norm's order is too,
// and the alignment of the data-parallel shards (sharding.hpp), so a block never straddles two.
inline constexpr std::int64_t kNormBlockElements = kDataParallelAlignment;

// Consecutive tensors of one decay group as AdamW segments over the flat range [0, N) (SPEC 7).
std::vector<DecaySegment> decay_segments(const ModelLayout& layout);

// docs/PRODUCTION.md "Throughput": 6 x (matrix parameters, the output projection counted even
// when tied) per position, plus 12 x L x H x hd per unmasked attention pair (s in
// [attention_start[t], t]) for QK^T and PV forward and backward.
double model_flops(const ModelConfig& config, const std::vector<Sample>& samples);

class Trainer {
 public:
  // Initializes the weights from the config's seed (SPEC 4), moments to 0, counters to 0.
  // Throws std::invalid_argument for a layout this trainer does not run (TP, PP or CP > 1; DP
  // different from the collectives' size) and std::runtime_error when the backend cannot be built.
  // With DP > 1 every rank constructs its Trainer and then calls the same methods in the same
  // order: run_iteration, host_state and restore exchange data with the other ranks.
  Trainer(const RunConfig& config, SampleProvider samples, const ProductionOptions& options);

  // One iteration: a successful or a skipped update. Fills the record SPEC 12 asks for, with the
  // global batch's numbers on every rank.
  IterationRecord run_iteration();

  const RunConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  const Counters& counters() const { return counters_; }

  // Evaluation of the validation split (docs/DATA.md section 12), the reference's evaluate on
  // this backend: `batches` forward-only global batches of `validation` from
  // counters().consumed_valid_samples on, each rank reading its microbatches in SPEC 2's order;
  // the masked CE summed as training sums its loss (rows in double, then microbatches m then
  // rank) in one running sum over the batches in order, / their loss tokens. The fused cross-entropy runs loss-only: no
  // gradient is computed. Advances consumed_valid_samples by batches x GBS; nothing else changes.
  // Collective: every rank calls it together; the record is the same on each.
  EvaluationRecord evaluate(const SampleProvider& validation, std::int64_t batches);
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  DType compute_dtype() const { return compute_; }
  Collectives& collectives() const { return *collectives_; }
  const FlatShards& shards() const { return shards_; }
  // Whether this rank holds only its shard of the main state (--use-distributed-optimizer, DP > 1).
  bool distributed_optimizer() const { return distributed_; }
  // The overlap this run does (DP > 1 only), and where the lane runs (comm_lane.hpp): for the log
  // header.
  bool overlaps_grad_reduce() const { return overlap_grad_reduce_; }
  bool overlaps_param_gather() const { return overlap_param_gather_; }
  const char* lane_description() const { return lane_->description(); }

  // The whole main state (downloaded; gathered from the shards with the distributed optimizer),
  // and its restoration (each rank uploads its range, then the compute copy is rebuilt).
  HostState host_state() const;
  void restore(const HostState& state);

  // For sharded checkpoints (core/checkpoint/sharded.hpp), with no exchange between ranks:
  // this rank's shard of the main state, its slices of the buckets cut at N (it holds them with
  // either optimizer), and the flat ranges this rank keeps: its slices with the distributed
  // optimizer, else [0, N).
  std::vector<MainStateSlice<float>> shard_pieces() const;
  std::vector<FlatRange> state_ranges() const;
  // Restores from `pieces`, one per state_ranges() entry and equal to it in range, and the
  // counters (every rank calls it: the compute copy is rebuilt collectively).
  void restore(std::span<const MainStateSlice<float>> pieces, const Counters& counters);

  // --audit-params: which flat elements to report in each iteration record (sorted).
  void set_audit_elements(std::vector<std::int64_t> elements) { audit_elements_ = std::move(elements); }

  // Tests: keep a host copy of each iteration's reduced, pre-clip main gradient [N] (one
  // download per iteration; gathered from the shards with the distributed optimizer, so with DP > 1
  // every rank must set it alike, as set_audit_elements).
  void keep_last_gradient(bool keep) { keep_last_gradient_ = keep; }
  const std::vector<float>& last_gradient() const { return last_gradient_; }
  // The last iteration's masked CE sum (double, summed over rows in order) for tests.
  double last_loss_sum() const { return last_loss_sum_; }

 private:
  // This rank's samples of microbatch m of the global batch after `consumed` samples (SPEC 2).
  std::vector<Sample> microbatch_samples(const SampleProvider& source, std::int64_t consumed,
                                         std::int64_t microbatch) const;
  // `partial` + the global batch's masked CE terms from row_losses_, added in SPEC 5's order
  // (collective).
  double global_loss_sum(double partial) const;
  // One bucket's reduce-scatter (the replicated optimizer: and its all-gather), on the caller's
  // thread or as a lane's work.
  void reduce_bucket(std::size_t bucket);
  // `mine` (this rank's contribution, count elements) := the DP contributions in rank order, the
  // others in received_grads_'s rows.
  void sum_in_rank_order(float* mine, std::int64_t count);
  // Forward/backward of the iteration's microbatches, with the reduction: overlapped with the last
  // microbatch's backward, or after it.
  void forward_backward_and_reduce(const std::vector<std::vector<Sample>>& batch,
                                   const std::vector<float>& loss_scales);
  // The compute copy of this rank's state (converted, or copied with fp32 and the distributed
  // optimizer), then, with the distributed optimizer, every bucket all-gathered.
  void publish_compute_weights();
  // The all-gathers --overlap-param-gather deferred to the next forward, now (evaluation).
  void finish_compute_weights();
  void gather_bucket_compute_weights(std::size_t bucket);
  const void* compute_weights() const;
  std::vector<float> gather_flat(const Buffer<float>& state_range) const;
  // This rank's offset of flat element `flat` in its state buffers, or -1 when it does not keep it.
  std::int64_t local_offset(std::int64_t flat) const;
  // read(flat, local, out): this rank's values of an audited element it holds (local: its offset
  // in the state buffers) into out[0 .. values_per_element).
  using AuditRead = std::function<void(std::int64_t flat, std::int64_t local, double* out)>;
  std::vector<double> audited_values(std::size_t values_per_element, const AuditRead& read) const;
  std::vector<AuditEntry> audit_before_update(const IterationRecord& record) const;
  void audit_after_update(std::vector<AuditEntry>& entries) const;

  RunConfig config_;
  ModelLayout layout_;
  SampleProvider samples_;
  ProductionOptions options_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Collectives> collectives_;
  FlatShards shards_;
  bool distributed_ = false;
  bool overlap_grad_reduce_ = false;
  bool overlap_param_gather_ = false;
  // The main state on this rank, in pieces of the flat buffer: its slices (distributed optimizer)
  // or [0, N), stored one after another in the state buffers.
  struct StatePiece {
    std::int64_t begin = 0;   // flat
    std::int64_t count = 0;
    std::int64_t local = 0;   // offset in main_weights_, exp_avg_, exp_avg_sq_
    std::vector<DecaySegment> segments;  // AdamW's, relative to begin
  };
  std::vector<StatePiece> pieces_;
  std::int64_t state_count_ = 0;  // elements of all pieces
  DType compute_ = DType::f32;
  Counters counters_;
  std::vector<std::int64_t> audit_elements_;

  Buffer<float> main_weights_;     // [state_count] fp32
  Buffer<float> main_grads_;       // [padded] fp32, accumulated over microbatches, zero padding
  std::int64_t exchange_chunk_ = 0;  // elements of a slice exchanged at once
  Buffer<float> received_grads_;   // [(DP-1) x exchange_chunk_] the others' contributions
  Buffer<float> exp_avg_;          // [state_count] fp32 m
  Buffer<float> exp_avg_sq_;       // [state_count] fp32 v
  // [padded] compute copy: bf16 with --bf16; fp32 with the distributed optimizer; empty when the
  // fp32 main weights are whole on this rank and serve as the compute weights.
  ComputeBuffer compute_weights_;
  bool gather_deferred_ = false;   // --overlap-param-gather: the next forward all-gathers
  // [padded / DP / kNormBlockElements] this rank's slices' squared-norm partials, bucket by bucket
  Buffer<double> norm_blocks_;
  std::unique_ptr<CommLane> lane_;
  Buffer<float> row_losses_;       // [microbatches, mbs*seq] masked CE per position
  std::unique_ptr<DecoderModel> model_;

  bool keep_last_gradient_ = false;
  std::vector<float> last_gradient_;  // [N] filled only when keep_last_gradient_ (tests)
  double last_loss_sum_ = 0;
};

}  // namespace tandem::production
