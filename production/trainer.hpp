// The production trainer: the fast twin of reference/trainer.hpp. The same iteration (SPEC 1-8),
// the same IterationRecord and audit entries, on a Backend (cuda, or cpu for CI), with SPEC 7's
// production state: fp32 main weights, fp32 main gradients accumulated over microbatches, fp32 m
// and v, and a bf16 compute copy of the weights with --bf16.
//
// One rank for now. The update path is already shaped for a distributed optimizer: gradients,
// weights and moments are contiguous fp32 buffers in the flat layout (core/model_layout.hpp), the
// norm is a sum of fixed-order partial sums, and AdamW runs over a flat range with decay segments,
// so a DP rank will run the same calls on its shard [begin, end) after a reduce-scatter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "core/train/main_state.hpp"
#include "core/train/records.hpp"
#include "production/backend.hpp"
#include "production/model.hpp"

namespace tandem::production {

// Test-only switches. The default (all empty) is the only path a user's run takes.
struct TestSwitches {
  // Iterations (1-based) whose reduced gradient is made NaN at flat element 0 (SPEC 8 tests), as
  // the reference's switch does.
  std::set<std::int64_t> nonfinite_gradient_iterations;
};

struct ProductionOptions {
  Device device = Device::cpu;
  std::int64_t logits_chunk_rows = 0;  // fused cross-entropy chunk; 0 = DecoderModel's default
  TestSwitches switches;
};

// The main state on the host, as a checkpoint holds it (fp32, SPEC 9).
using HostState = MainState<float>;

using SampleProvider = std::function<Sample(std::int64_t global_index)>;

// Elements of the flat buffer per norm partial sum (SPEC 6): fixed, so the norm's order is too.
inline constexpr std::int64_t kNormBlockElements = std::int64_t{1} << 16;

// Consecutive tensors of one decay group as AdamW segments over the flat range [0, N) (SPEC 7).
std::vector<DecaySegment> decay_segments(const ModelLayout& layout);

// docs/PRODUCTION.md "Throughput": 6 x (matrix parameters, the output projection counted even
// when tied) per position, plus 12 x L x H x hd per unmasked attention pair (s in
// [attention_start[t], t]) for QK^T and PV forward and backward.
double model_flops(const ModelConfig& config, const std::vector<Sample>& samples);

class Trainer {
 public:
  // Initializes the weights from the config's seed (SPEC 4), moments to 0, counters to 0.
  // Throws std::invalid_argument for a layout this single-rank trainer does not run (TP, PP, CP
  // or DP > 1) and std::runtime_error when the backend cannot be built.
  Trainer(const RunConfig& config, SampleProvider samples, const ProductionOptions& options);

  // One iteration: a successful or a skipped update. Fills the record SPEC 12 asks for.
  IterationRecord run_iteration();

  const RunConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  const Counters& counters() const { return counters_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  DType compute_dtype() const { return compute_; }

  // The main state (downloaded), and its restoration (uploads, then rewrites the bf16 copy).
  HostState host_state() const;
  void restore(const HostState& state);

  // --audit-params: which flat elements to report in each iteration record (sorted).
  void set_audit_elements(std::vector<std::int64_t> elements) { audit_elements_ = std::move(elements); }

  // Tests: keep a host copy of each iteration's reduced, pre-clip main gradient [N] (one
  // download per iteration), read by last_gradient().
  void keep_last_gradient(bool keep) { keep_last_gradient_ = keep; }
  const std::vector<float>& last_gradient() const { return last_gradient_; }
  // The last iteration's masked CE sum (double, summed over rows in order) for tests.
  double last_loss_sum() const { return last_loss_sum_; }

 private:
  std::vector<Sample> microbatch_samples(std::int64_t microbatch) const;
  void refresh_compute_weights();
  const void* compute_weights() const;
  std::vector<AuditEntry> audit_before_update(const IterationRecord& record) const;
  void audit_after_update(std::vector<AuditEntry>& entries) const;

  RunConfig config_;
  ModelLayout layout_;
  SampleProvider samples_;
  ProductionOptions options_;
  std::unique_ptr<Backend> backend_;
  DType compute_ = DType::f32;
  std::vector<DecaySegment> segments_;
  Counters counters_;
  std::vector<std::int64_t> audit_elements_;

  Buffer<float> main_weights_;     // [N] fp32
  Buffer<float> main_grads_;       // [N] fp32, accumulated over microbatches
  Buffer<float> exp_avg_;          // [N] fp32 m
  Buffer<float> exp_avg_sq_;       // [N] fp32 v
  ComputeBuffer compute_weights_;  // [N] bf16 copy with --bf16; empty for fp32
  Buffer<double> norm_blocks_;     // [ceil(N / kNormBlockElements)] squared-norm partial sums
  Buffer<float> row_losses_;       // [microbatches, mbs*seq] masked CE per position
  std::unique_ptr<DecoderModel> model_;

  bool keep_last_gradient_ = false;
  std::vector<float> last_gradient_;  // [N] filled only when keep_last_gradient_ (tests)
  double last_loss_sum_ = 0;
};

}  // namespace tandem::production
