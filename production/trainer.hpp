// The production trainer: the fast twin of reference/trainer.hpp. The same iteration (SPEC 1-8),
// the same IterationRecord and audit entries, on a Backend (cuda, or cpu for CI), with SPEC 7's
// production state: fp32 main weights, fp32 main gradients accumulated over microbatches, fp32 m
// and v, and a bf16 compute copy of the weights with --bf16.
//
// The step (run_iteration) reads as the algorithm, one named call per SPEC rule:
//   read the global batch and count its tokens (SPEC 2, 5) -> forward/backward each microbatch
//   and reduce over replicas (SPEC 5, 1) -> loss (SPEC 5) -> norm (SPEC 6) -> finite check
//   (SPEC 8) -> clip (SPEC 6) -> AdamW (SPEC 7) -> schedule and counters (SPEC 8).
// Its parts live in their own units:
//   - gradient_exchange.hpp: the main gradients, buckets, the reduction over data-parallel ranks
//     in rank order, the norm's partial sums, the distributed optimizer's weight gathers, and
//     Megatron's overlap of both with the compute;
//   - main_state_shard.hpp: this rank's pieces of the fp32 main state (checkpoints read and
//     restore them; production/checkpointing.hpp);
//   - update_audit.hpp: --audit-params;
//   - step_hooks.hpp: the one object through which tests inject faults and the harness its
//     negative controls (ProductionOptions::hooks; none on a user's run).
//
// Data parallel (DP ranks, one Trainer per rank, exchanging through production/collectives/):
// rank r reads its own microbatches (SPEC 2) and accumulates its fp32 main gradients; then the
// exchange reduces them. Either the distributed optimizer (--use-distributed-optimizer,
// Megatron's: each rank keeps only its slices of the main weights, m and v, runs AdamW on them and
// all-gathers the compute weights bucket by bucket) or the replicated optimizer (Megatron's
// default: every rank runs AdamW over the whole buffer). Both compute every element with the same
// operations on the same inputs: their states are bitwise equal
// (tests/production_data_parallel_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "core/run_layout.hpp"
#include "core/train/main_state.hpp"
#include "core/train/records.hpp"
#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"
#include "production/gradient_exchange.hpp"
#include "production/main_state_shard.hpp"
#include "production/model.hpp"
#include "core/pipeline_schedule.hpp"
#include "production/sharding.hpp"
#include "production/step_hooks.hpp"
#include "production/tensor_parallel.hpp"
#include "production/tensor_parallel_comm.hpp"
#include "production/update_audit.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// This rank's collectives, made once its backend exists (NCCL needs the backend's stream).
using CollectivesFactory = std::function<std::shared_ptr<Collectives>(Backend& backend)>;

struct ProductionOptions {
  Device device = Device::cpu;
  int device_index = 0;                // cuda device of this rank (its local rank)
  HostKernels host_kernels = HostKernels::fast;  // the cpu backend's (tests, benchmarks: ordered)
  int cpu_threads = 1;                 // the cpu backend's threads (--cpu-threads; the same bits for any)
  std::int64_t logits_chunk_rows = 0;  // fused cross-entropy chunk; 0 = DecoderModel's default
  // This rank's groups (Megatron's rank order: TP fastest, then DP): its data-parallel ranks
  // (size() = DP; empty: one), its tensor-parallel ranks (size() = TP; empty: TP 1), and every
  // rank of the run (checkpoints, agreement; empty: the data-parallel ranks, which are every rank
  // when TP is 1). Made in this order.
  CollectivesFactory collectives;
  CollectivesFactory tensor_parallel;
  CollectivesFactory world;
  // Pipeline parallelism: this rank's pipeline group (size() = PP, ranks in stage order; empty:
  // PP 1) and its embedding group (the first and last stage; null or empty on a middle stage, or
  // with PP 1). Made after the three above, in this order.
  CollectivesFactory pipeline;
  CollectivesFactory embedding;
  // PP > 1: time every pass of every stage (Trainer::last_timeline; --log-pipeline-timeline).
  bool pipeline_timeline = false;
  // The run's layout (core/run_layout.hpp), shared by the ranks of one process; null: the Trainer
  // derives it from the configuration. It must be the configuration's (the Trainer checks).
  std::shared_ptr<const RunLayout> layout;
  // Injected faults and negative controls (step_hooks.hpp, make_test_hooks); null on a user's run.
  std::shared_ptr<const StepHooks> hooks;
};

// One iteration's passes on every pipeline stage as they ran: seconds from a common start (after
// a barrier of the pipeline group; one clock on one node, the barrier's skew between nodes).
struct TimedPass {
  PipelinePass pass;
  double start = 0.0;
  double end = 0.0;
};
struct PipelineTimeline {
  std::int64_t iteration = 0;
  std::vector<std::vector<TimedPass>> stages;  // [PP][passes in the order the stage ran them]
  double span() const;                         // the last pass's end on any stage
  double busy(std::size_t stage) const;        // the stage's passes' time
  // Idle time over every stage's span: sum over stages of (span - busy) / (PP x span); the plan's
  // bubble (p - 1) / (v m + p - 1) when the passes take their ideal times.
  double idle_fraction() const;
};

// The main state on the host, as a checkpoint holds it (fp32, SPEC 9).
using HostState = MainState<Real>;

using SampleProvider = std::function<Sample(std::int64_t global_index)>;

// Consecutive tensors of one decay group as AdamW segments over the flat range [0, N) (SPEC 7).
std::vector<DecaySegment> decay_segments(const ModelLayout& layout);

// docs/PRODUCTION.md "Throughput": 6 x (matrix parameters, the output projection counted even
// when tied) per position, plus 12 x L x H x hd per unmasked attention pair (s in
// [attention_start[t], t]) for QK^T and PV forward and backward.
double model_flops(const ModelConfig& config, const std::vector<Sample>& samples);

class Trainer {
 public:
  // Initializes the weights from the config's seed (SPEC 4), moments to 0, counters to 0.
  // Throws std::invalid_argument for a layout this trainer does not run (CP > 1; DP, TP or PP
  // different from its groups' sizes) and std::runtime_error when the backend cannot be built.
  // With several ranks every rank constructs its Trainer and then calls the same methods in the
  // same order: run_iteration, host_state and restore exchange data with the other ranks.
  Trainer(const RunConfig& config, SampleProvider samples, const ProductionOptions& options);
  Trainer(const Trainer&) = delete;  // its units keep references into it
  Trainer& operator=(const Trainer&) = delete;

  // One iteration: a successful or a skipped update. Fills the record SPEC 12 asks for, with the
  // global batch's numbers on every rank.
  IterationRecord run_iteration();

  const RunConfig& config() const { return config_; }
  // The model's whole layout (checkpoints, exports, the log header), and this rank's part of it
  // under tensor parallelism (the same with TP 1).
  const ModelLayout& layout() const { return split_.full(); }
  const TensorParallelLayout& tensor_parallel() const { return split_; }
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
  // Every rank of the run, and this rank's data-parallel and tensor-parallel groups.
  Collectives& collectives() const { return *world_; }
  Collectives& replicas() const { return *collectives_; }
  Collectives& tensor_parallel_group() const { return *tp_group_; }
  Collectives& pipeline_group() const { return *pipeline_group_; }
  // This rank's pipeline stage and its layers (core/pipeline_layout.hpp).
  const PipelineStages& pipeline_stages() const { return *stages_; }
  std::int64_t pipeline_stage() const { return split_.pipeline_stage(); }
  bool sequence_parallel() const { return config_.parallel.sequence_parallel && split_.size() > 1; }
  const FlatShards& shards() const { return exchange_.shards(); }
  const GradientExchange& exchange() const { return exchange_; }
  // Whether this rank holds only its shard of the main state (--use-distributed-optimizer, DP > 1).
  bool distributed_optimizer() const { return exchange_.distributed(); }
  // The overlap this run does (DP > 1 only), and where the lane runs (comm_lane.hpp): for the log
  // header.
  bool overlaps_grad_reduce() const { return exchange_.overlaps_grad_reduce(); }
  bool overlaps_param_gather() const { return exchange_.overlaps_param_gather(); }
  const char* lane_description() const { return exchange_.lane_description(); }

  // The whole main state (downloaded; gathered from the shards with the distributed optimizer),
  // and its restoration (each rank uploads its range, then the compute copy is rebuilt).
  HostState host_state() const;
  void restore(const HostState& state);

  // For sharded checkpoints (core/checkpoint/sharded.hpp), with no exchange between ranks, in
  // the whole model's flat ranges (a TP rank's part of a row-parallel matrix is a range per
  // row): this rank's shard of the main state, its slices of the buckets cut at N (it holds them
  // with either optimizer), and the flat ranges this rank keeps: its slices with the distributed
  // optimizer, else its whole part.
  std::vector<MainStateSlice<Real>> shard_pieces() const;
  std::vector<FlatRange> state_ranges() const;
  // Restores from `pieces`, one per state_ranges() entry and equal to it in range, and the
  // counters (every rank calls it: the compute copy is rebuilt collectively).
  void restore(std::span<const MainStateSlice<Real>> pieces, const Counters& counters);

  // --audit-params: which flat elements to report in each iteration record (sorted).
  void set_audit_elements(std::vector<std::int64_t> elements) { audit_->set_elements(std::move(elements)); }

  // Tests: keep a host copy of each iteration's reduced, pre-clip main gradient [N] (one
  // download per iteration; gathered from the shards with the distributed optimizer, so with DP > 1
  // every rank must set it alike, as set_audit_elements).
  void keep_last_gradient(bool keep) { keep_last_gradient_ = keep; }
  const std::vector<Real>& last_gradient() const { return last_gradient_; }
  // The last iteration's pipeline timeline (ProductionOptions::pipeline_timeline, PP > 1), else empty.
  const std::optional<PipelineTimeline>& last_timeline() const { return last_timeline_; }
  // The last iteration's masked CE sum (double, summed over rows in order) for tests.
  double last_loss_sum() const { return last_loss_sum_; }
  // The model (its activation memory: docs/PRODUCTION.md "Memory").
  const DecoderModel& model() const { return *model_; }

 private:
  // This rank's part of one global batch (SPEC 2) and the global batch's counts (SPEC 5).
  struct GlobalBatch {
    std::vector<std::vector<Sample>> microbatches;  // [M][mbs] this rank's samples
    std::int64_t input_tokens = 0;   // of the global batch, every rank
    std::int64_t loss_tokens = 0;
    std::int64_t pad_tokens = 0;
    std::int64_t rank_loss_tokens = 0;  // of this rank's microbatches
    double model_flops = 0;          // of the global batch (docs/PRODUCTION.md "Throughput")
  };

  // The step's phases, in order (run_iteration).
  GlobalBatch read_global_batch(std::int64_t consumed) const;           // SPEC 2, 5
  std::vector<Real> loss_scales(const GlobalBatch& batch) const;       // SPEC 5
  void forward_backward_and_reduce(const GlobalBatch& batch);           // SPEC 5, 1
  double global_loss(const GlobalBatch& batch, std::int64_t iteration); // SPEC 5
  double clip(const GradientNorm& norm, IterationRecord& record);       // SPEC 6
  void adamw(std::int64_t step, double lr, double wd);                  // SPEC 7
  void count_update(IterationRecord& record, bool successful);          // SPEC 8, 1

  // Pipeline parallelism: this stage's passes over M microbatches (core/pipeline_schedule.hpp: 1F1B
  // with one chunk a rank, else the interleaved 1F1B), and their execution: `pass_body` runs each
  // pass with its microbatch's activation slot and its (microbatch, chunk)'s chunk slot
  // (chunk_activation_slots), and the streams (or their gradients) a step's passes send are
  // exchanged with the previous or next stage together with what the next step receives
  // (stage_exchanges).
  std::vector<PipelinePass> training_passes() const;
  using PassBody = std::function<void(const PipelinePass& pass, std::int64_t slot, std::int64_t chunk_slot)>;
  void run_passes(const std::vector<PipelinePass>& passes, const PassBody& pass_body,
                  std::vector<TimedPass>* timings = nullptr);
  // Every stage's timings gathered over the pipeline group (each stage runs as many passes).
  PipelineTimeline gather_timeline(std::int64_t iteration, const std::vector<TimedPass>& mine) const;

  // This rank's samples of microbatch m of the global batch after `consumed` samples (SPEC 2).
  std::vector<Sample> microbatch_samples(const SampleProvider& source, std::int64_t consumed,
                                         std::int64_t microbatch) const;
  // `partial` + the global batch's masked CE terms from row_losses_, added in SPEC 5's order
  // (collective).
  double global_loss_sum(double partial) const;
  double replicas_loss_sum(double partial) const;  // the same over this stage's data-parallel ranks
  // The compute copy of this rank's state (converted, or copied with fp32 and the distributed
  // optimizer), then the exchange's weight gathers.
  void publish_compute_weights(GradientExchange::WeightGather when);
  // The compute weights the model reads: the compute copy, or the fp32 main weights when they are
  // whole on this rank and fp32 is the compute type.
  const void* compute_weights() const;
  // Tensor parallelism: with --sequence-parallel the replicated tensors' gradients (partial per
  // TP rank) summed over TP; the norm's sum of squares over TP (the replicated tensors counted on
  // TP rank 0 only).
  void sum_replicated_gradients_over_tp();
  void sum_shared_key_value_gradients();
  // Pipeline parallelism with tied embeddings: the first and the last stage's reduced gradients of
  // their embedding copies summed over the embedding group (first + last), where this rank keeps
  // them; both copies then take the same update (Megatron's embedding all-reduce).
  void sum_tied_embedding_gradients();
  // The main gradients rounded to bf16 in place (a negative control's StepHooks point only).
  void round_main_gradients_to_bf16();
  GradientNorm gradient_norm(bool own_slices);
  // The local ranges whose elements another rank counts in the norm (SPEC 6: every element once):
  // the replicated tensors off TP rank 0, the shared key/value rows off their first holder, the
  // last stage's copy of a tied embedding.
  std::vector<FlatRange> not_counted_here() const;
  // A local buffer [local N] on every rank of the TP and PP groups -> the whole model's [N], each
  // rank's elements at their places (collective over TP, then PP).
  std::vector<Real> gather_whole_model(const std::vector<Real>& local) const;
  std::vector<Real> gather_over_pipeline(std::vector<Real> stage_whole) const;
  // The whole-model ranges this rank keeps, each TP-local piece expanded.
  std::vector<FlatRange> full_ranges_of(const std::vector<FlatRange>& local) const;
  const StepHooks& hooks() const { return *hooks_; }

  RunConfig config_;
  std::shared_ptr<const RunLayout> run_layout_;  // ProductionOptions::layout, or derived from config_
  const PipelineStages* stages_ = nullptr;        // run_layout_'s: Megatron's layers per stage
  TensorParallelLayout split_;   // this rank's part of the model (TP 1, PP 1: the whole)
  const ModelLayout& layout_;    // split_.local(): the buffers' layout
  SampleProvider samples_;
  ProductionOptions options_;
  std::shared_ptr<const StepHooks> hooks_;  // options_.hooks, or the identity
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Collectives> collectives_;  // the data-parallel ranks
  std::shared_ptr<Collectives> tp_group_;     // the tensor-parallel ranks
  std::shared_ptr<Collectives> world_;        // every rank
  std::shared_ptr<Collectives> pipeline_group_;   // the pipeline stages of this rank's (tp, dp)
  std::shared_ptr<Collectives> embedding_group_;  // first and last stage; null elsewhere and at PP 1
  TensorParallelComm tp_comm_;
  TensorParallelComm embedding_comm_;  // sums over the embedding group (PP > 1, tied)
  DType compute_ = DType::f32;
  Counters counters_;

  GradientExchange exchange_;
  MainStateShard state_;
  // [padded] compute copy: bf16 with --bf16; fp32 with the distributed optimizer; empty when the
  // fp32 main weights are whole on this rank and serve as the compute weights.
  ComputeBuffer compute_weights_;
  std::unique_ptr<UpdateAudit> audit_;
  Buffer<Real> row_losses_;       // [microbatches, mbs*seq] masked CE per position
  std::unique_ptr<DecoderModel> model_;
  Buffer<std::uint8_t> outgoing_;  // [2, stream bytes] what this stage sends next (PP > 1)
  std::optional<PipelineTimeline> last_timeline_;
  std::chrono::steady_clock::time_point timing_start_;  // of the iteration's passes (timed)
  Buffer<std::uint8_t> incoming_;  // [2, stream bytes] what it received for the passes ahead

  bool keep_last_gradient_ = false;
  std::vector<Real> last_gradient_;  // [N] filled only when keep_last_gradient_ (tests)
  double last_loss_sum_ = 0;
};

}  // namespace tandem::production
