// The twins the harness compares, behind one small interface: the reference (the truth), the
// twins under test (today the double reference on its own layout; the production trainer's cpu
// and cuda backends when production/trainer.hpp lands: one entry in twins_under_test()), and the
// deliberately wrong "mutants" the negative controls run (a harness that passes a mutant has a
// hole). Every state crosses the interface widened to double, which is exact for fp32 and double.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/train/records.hpp"
#include "equivalence/tolerance.hpp"
#include "reference/trainer.hpp"

namespace tandem::equivalence {

// Main state widened to double, in the flat layout of core/model_layout.hpp.
struct TwinState {
  std::vector<double> params;      // [P] main weights
  std::vector<double> exp_avg;     // [P] Adam m
  std::vector<double> exp_avg_sq;  // [P] Adam v
  Counters counters;
};

// `state` of an untied model with the final norm's weight and the output layer multiplied by
// `factor`: every path to the loss crosses both, so the whole gradient shrinks with it (a factor
// of 1e-6 puts the gradient norm near SPEC 6's epsilon). A tied model is refused: scaling its
// embedding shrinks the input too (through the first norm's epsilon the gradient then falls to
// 1e-11 and below).
TwinState with_the_top_of_the_model_scaled(TwinState state, const ModelConfig& model, double factor);

// What a twin is built from: the run (its batch/parallel sections are this twin's layout), the
// shipped samples, and the injected non-finite gradients of the case (an input, not a bug).
struct TwinSetup {
  RunConfig config;
  reference::SampleProvider samples;
  std::set<std::int64_t> nonfinite_gradient_iterations;  // 1-based iterations
  double nonfinite_gradient_value = 0;                    // written into ...
  std::int64_t nonfinite_gradient_element = 0;            // ... this flat element
  std::set<std::int64_t> nonfinite_loss_iterations;       // 1-based: the loss becomes ...
  double nonfinite_loss_value = 0;                        // ... this value
};

class Twin {
 public:
  virtual ~Twin() = default;
  virtual std::string description() const = 0;  // "reference<double>, DP 2 x 2 microbatches x mbs 1"
  virtual Precision precision() const = 0;
  virtual IterationRecord run_iteration() = 0;
  virtual TwinState state() const = 0;
  // Loads a state (rounded to the twin's main precision); teacher forcing and schedule positions.
  virtual void load_state(const TwinState& state) = 0;
  // The main gradient the optimizer used in the last iteration: reduced, clipped when clipped.
  virtual std::vector<double> last_gradient() const = 0;
  // The sample at a global index exactly as this twin consumes it (positions, spans, masks).
  virtual Sample consumed_sample(std::int64_t global_index) const = 0;
  // Writes a checkpoint into `directory` as the twin's engine does (SPEC 9; the production twin
  // with DP > 1: each rank its shard), and resumes from one. Under MPI ranks each process may name
  // its own directory: the twin uses rank 0's. Only for kinds with `checkpoints`.
  virtual void save_checkpoint(const std::filesystem::path& directory) const = 0;
  virtual void resume_from(const std::filesystem::path& directory) = 0;
};

// One AdamW element update (SPEC 7) as a twin's optimizer computes it, in double.
struct AdamwElement {
  double param = 0, exp_avg = 0, exp_avg_sq = 0;
};
struct AdamwElementCall {
  AdamwElement before;
  double grad = 0;
  double lr = 0, wd = 0;
  OptimizerConfig optimizer;  // beta1, beta2, eps
  std::int64_t step = 1;      // t >= 1
};
using AdamwElementFunction = std::function<AdamwElement(const AdamwElementCall&)>;

// The deliberately wrong variants (trainer-side ones live in reference::Mutants; the data-side
// ones rewrite the Sample the twin consumes; the production-side ones are data- and
// tensor-parallel bugs in production::ProductionMutants, run on 2 ranks).
enum class Mutant {
  decay_norm_weights,
  l2_instead_of_decoupled,
  clip_per_rank,
  microbatch_mean_under_per_token,
  eps_inside_sqrt,
  bias_correction_off_by_one,
  scheduler_advances_on_skip,
  clip_without_epsilon,         // SPEC 6: coeff = clip / norm, the 1e-6 dropped (a bug the harness once missed)
  cross_document_attention,
  positions_not_reset,
  unreduced_gradients,          // production: each rank updates with its own gradient
  rank_local_loss_denominator,  // production: per-token scale by the rank's own loss tokens
  shard_local_norm,             // production: each rank clips by its own shard's norm
  // Tensor-parallel bugs (production, TP 2 on threads):
  unsummed_sequence_parallel_gradients,  // norm weights' gradients not summed over TP under SP
  replicated_counted_per_rank,  // a replicated tensor counted TP times in the norm
  local_vocabulary_normalizer,  // the cross-entropy normalized over the rank's vocabulary part
  row_parallel_summed_twice,    // a row-parallel output summed over TP twice
  row_parallel_not_summed,      // ... or not at all
  // Pipeline-parallel bugs (production, PP 2 on threads, tied embeddings):
  tied_embedding_not_summed,    // each stage updates its embedding copy with its own gradient
  tied_embedding_counted_twice,  // both copies counted in the norm
  stage_local_norm,             // each stage clips by (and reports) its own stage's norm
  microbatches_out_of_order,    // the first stage feeds microbatch m + 1 where m is due
  last_stage_microbatch_loss,   // the last stage normalizes each microbatch's loss by its own tokens
  // Semantic bugs of about one part in a million (production, the semantic twin: only its fp64
  // bounds are sharp enough to see them):
  production_clip_without_epsilon,  // production's clip coefficient as clip / norm
  adam_epsilon_scaled_by_bias_correction,  // AdamW adds eps * sqrt(1 - b2^t), not eps, to sqrt(v_hat)
  loss_scale_one_part_in_a_billion,  // the gradients' loss scale (1 + 1e-9) x SPEC 5's
  // A precision bug of a few fp32 roundings (production fp32: only the statistical bounds see it,
  // the worst-case ones being far above its error):
  norm_squares_summed_in_fp32,  // the norm's squares added in fp32, not double
};
std::vector<Mutant> all_mutants();
std::string to_string(Mutant mutant);  // "eps_inside_sqrt"
bool is_production_side(Mutant mutant);
// A precision bug that only the statistical bounds see (in fp32).
bool is_precision_side(Mutant mutant);

// A kind of twin: how to build one, and its arithmetic.
struct TwinKind {
  std::string name;          // "reference-double", "production-cpu", "mutant-eps_inside_sqrt"
  std::string description;   // one line for reports
  Precision precision;       // its main arithmetic
  bool compute_follows_bf16 = false;  // --bf16 makes its compute stores bf16 (production)
  bool checkpoints = false;  // supports save_checkpoint()/resume_from()
  std::int64_t max_data_parallel = 0;  // largest DP it runs (0: any)
  std::int64_t required_data_parallel = 0;  // the only DP it runs (0: any)
  std::int64_t required_world_size = 0;     // the only TP x DP it runs (0: any): the MPI ranks
  std::int64_t max_tensor_parallel = 0;     // largest TP it runs (0: any)
  std::int64_t required_tensor_parallel = 0;  // the only TP it runs (0: any)
  bool requires_sequence_parallel = false;    // runs with --sequence-parallel only
  std::int64_t max_pipeline_parallel = 0;     // largest PP it runs (0: any)
  std::int64_t required_pipeline_parallel = 0;  // the only PP it runs (0: any), with tied embeddings
  bool injects_any_value = true;       // false: only NaN at flat element 0 (production's switch)
  std::function<std::unique_ptr<Twin>(const TwinSetup&)> make;
  AdamwElementFunction adamw_element;  // empty when the twin's optimizer is not callable per element
};

// The twin's arithmetic for this run (bf16 compute stores under --bf16 where it has them).
Precision precision_of(const TwinKind& kind, const RunConfig& config);

// The truth: the double reference (reference/trainer.hpp).
TwinKind reference_twin();
// The 50-digit reference (the CLI's truth: `tandem check`).
TwinKind reference50_twin();
// Everything that must equal the reference: the double reference on its own layout, the
// production trainer on the cpu backend, its semantic build, and the cuda backend when it is
// built and a device answers.
std::vector<TwinKind> twins_under_test();
// How a multi-rank production twin's ranks meet: threads of this process (cpu backend, any DP),
// or this process as one of the MPI ranks of an `mpirun` (DP = the world size; every rank runs
// the same cases in lockstep, verdict.hpp).
enum class RankTransport { threads, mpi };
// The production trainer (production/trainer.hpp) on a backend.
TwinKind production_twin(bool cuda, RankTransport transport = RankTransport::threads);
// The cuda backend with TP x DP ranks on threads of this process, all on the one GPU, their
// exchanges staged through host memory (production/collectives/staged.hpp): tensor
// parallelism's CUDA path on a machine with one device.
TwinKind production_cuda_ranks_twin();
// The cuda backend on cuda-sim (docs/CUDA-SIM.md): the production trainer's cuda build with the
// shipped CUDA sources run on the CPU, any TP x PP x DP as ranks on threads of this process, their
// exchanges staged through host memory as on one GPU. No GPU needed; no checkpoints. `mutant`: one
// of the production trainer's own mutants (is_production_side, not a semantic-build one) switched
// on, as a negative control of the cuda build; std::invalid_argument for any other.
TwinKind production_cuda_sim_twin(std::optional<Mutant> mutant = std::nullopt);
// The production trainer from the semantic build of its sources (production/arithmetic.hpp: Real
// = double, the cpu backend): the same orchestration with rounding at 2^-53, held to fp64 bounds,
// so that a semantic deviation of 1e-9 stands far outside them. No checkpoints, no bf16 (a bf16
// case runs in fp64 compute).
TwinKind production_semantic_twin(RankTransport transport = RankTransport::threads);
// Whether the cuda backend is built and a device answers.
bool cuda_device_answers();
// The reference with one mutant switched on. `at_production_tolerance`: held to the bounds of an
// fp32 (bf16 under --bf16) twin, to show production's looser tolerance still catches it.
TwinKind mutant_twin(Mutant mutant, bool at_production_tolerance = false);

// The samples of a provider rewritten as a data-side mutant consumes them (identity for the
// trainer-side mutants).
Sample mutate_sample(Mutant mutant, Sample sample);

}  // namespace tandem::equivalence
