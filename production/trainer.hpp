// The production trainer: the fast twin of reference/trainer.hpp. The same iteration (SPEC 1-8),
// the same IterationRecord and audit entries, on a Backend (cuda, or cpu for CI), with SPEC 7's
// production state: fp32 main weights, fp32 main gradients accumulated over microbatches, fp32 m
// and v, and a bf16 compute copy of the weights with --bf16.
//
// Data parallel (DP ranks, one Trainer per rank, exchanging through production/collectives/):
// rank r reads its own microbatches (SPEC 2), accumulates its fp32 main gradients, and the ranks
// reduce-scatter them in a ring: each rank receives every other rank's contribution to its shard
// (sharding.hpp), one step at a time, and adds it with its backend in a fixed order, so the
// reduction's bits do not depend on the transport.
// The norm sums fixed blocks that never straddle a shard. Then either
//   - the distributed optimizer (--use-distributed-optimizer, Megatron's): each rank keeps only
//     its shard of the main weights, m and v, runs AdamW on it and all-gathers the compute
//     weights; or
//   - the replicated optimizer (Megatron's default): the reduced shards are all-gathered and every
//     rank runs AdamW over the whole buffer.
// Both compute every element with the same operations on the same inputs: their states are
// bitwise equal (tests/production_data_parallel_test.cpp).
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
inline constexpr std::int64_t kNormBlockElements = std::int64_t{1} << 10;

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

  // The whole main state (downloaded; gathered from the shards with the distributed optimizer),
  // and its restoration (each rank uploads its range, then the compute copy is rebuilt).
  HostState host_state() const;
  void restore(const HostState& state);

  // For sharded checkpoints (core/checkpoint/sharded.hpp), with no exchange between ranks:
  // this rank's shard of the main state [shards().begin(rank), + count(rank)) (it holds it with
  // either optimizer), and the flat range this rank keeps, [begin, begin + count): its shard with
  // the distributed optimizer, else everything.
  MainStateSlice<float> shard_state() const;
  std::int64_t state_begin() const { return state_begin_; }
  std::int64_t state_count() const { return state_count_; }
  // Restores from `slice`, which must cover this rank's range, and the counters (every rank
  // calls it: the compute copy is rebuilt collectively).
  void restore(const MainStateSlice<float>& slice, const Counters& counters);
  // The same as pieces, for a sharding that gives a rank several flat ranges (one per gradient
  // bucket): this rank's shard of the main state as pieces in increasing flat order (none when it
  // owns nothing), what a sharded save writes;
  std::vector<MainStateSlice<float>> shard_pieces() const;
  // the flat ranges this rank keeps, in increasing order (none when it keeps nothing), what a
  // resume reads;
  std::vector<FlatRange> state_ranges() const;
  // and the restoration from exactly those ranges' `pieces` and the counters (collective, as above).
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
  void reduce_gradients();
  void publish_compute_weights();
  const void* compute_weights() const;
  std::vector<float> gather_flat(const Buffer<float>& state_range) const;
  // read(flat, local, out): this rank's values of an audited element it holds (local: its offset
  // in the state range) into out[0 .. values_per_element).
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
  // The main state's range on this rank: its shard (distributed optimizer) or [0, N).
  std::int64_t state_begin_ = 0;
  std::int64_t state_count_ = 0;
  DType compute_ = DType::f32;
  std::vector<DecaySegment> segments_;  // AdamW's segments over the state range
  Counters counters_;
  std::vector<std::int64_t> audit_elements_;

  Buffer<float> main_weights_;     // [state_count] fp32
  Buffer<float> main_grads_;       // [DP x S] fp32, accumulated over microbatches, zero padding
  Buffer<float> received_grads_;   // [S] one ring step's receive (DP > 1 only)
  Buffer<float> exp_avg_;          // [state_count] fp32 m
  Buffer<float> exp_avg_sq_;       // [state_count] fp32 v
  // [DP x S] compute copy: bf16 with --bf16; fp32 with the distributed optimizer; empty when the
  // fp32 main weights are whole on this rank and serve as the compute weights.
  ComputeBuffer compute_weights_;
  Buffer<double> norm_blocks_;     // [S / kNormBlockElements] this shard's squared-norm partials
  Buffer<float> row_losses_;       // [microbatches, mbs*seq] masked CE per position
  std::unique_ptr<DecoderModel> model_;

  bool keep_last_gradient_ = false;
  std::vector<float> last_gradient_;  // [N] filled only when keep_last_gradient_ (tests)
  double last_loss_sum_ = 0;
};

}  // namespace tandem::production
