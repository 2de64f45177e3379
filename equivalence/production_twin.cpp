// The production trainer as a twin (twin.hpp), for one build of the production sources
// (production/arithmetic.hpp). This file is compiled three times: as itself against
// tandem_production (Real = float: the production-cpu, -cuda and -mpi twins), through
// production_twin_semantic.cpp against tandem_production_semantic (Real = double: the semantic
// twin), and through production_twin_cuda_sim.cpp against tandem_production_cuda_sim (the cuda
// backend on cuda-sim, docs/CUDA-SIM.md). Everything but the one entry point each build exports
// has internal linkage, so the copies never meet.
#include "equivalence/production_twin.hpp"

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "production/collectives/collectives.hpp"
#include "production/kernels/optimizer.hpp"
#include "production/local_ranks.hpp"
#include "production/step_hooks.hpp"
#include "production/trainer.hpp"
// The semantic and cuda-sim builds have no checkpoints (their kinds say so: TwinKind::checkpoints).
#if !defined(TANDEM_PRODUCTION_SEMANTIC) && !defined(TANDEM_PRODUCTION_CUDA_SIM)
#define TANDEM_TWIN_CHECKPOINTS 1
#include "production/checkpointing.hpp"
#endif

namespace tandem::equivalence {
namespace {

using production::Real;

// The production trainer on a backend (production/trainer.hpp). Its main state is Real (fp32, or
// fp64 in the semantic build), so the state crosses the interface widened exactly; its test
// switch makes flat element 0 NaN. With DP > 1 it runs one Trainer per rank: on threads of this
// process (thread_group.hpp), or, under `mpirun`, as this process's rank of MPI_COMM_WORLD (every
// rank runs the same case in lockstep; a DP 1 run, such as a direct global batch, runs in each
// process alone). Every call reaches every rank; rank 0 answers.
class ProductionTwin final : public Twin {
 public:
  ProductionTwin(const TwinSetup& setup, bool cuda, RankTransport transport,
                 production::ProductionMutants mutants = {})
      : samples_(setup.samples),
        ranks_(setup.config, samples_, options(setup, cuda, mutants),
               transport == RankTransport::mpi ? production::LocalRanks::Transport::mpi
                                               : production::LocalRanks::Transport::threads) {
    ranks_.each([](production::Trainer& trainer, int) { trainer.keep_last_gradient(true); });
  }

  std::string description() const override {
    const production::Trainer& trainer = ranks_.front();
    const std::string arithmetic = production::kSemanticBuild ? "fp64 semantic"
                                   : trainer.compute_dtype() == production::DType::bf16 ? "bf16"
                                                                                        : "fp32";
#if defined(TANDEM_PRODUCTION_CUDA_SIM)
    const std::string device = "cuda-sim";
#else
    const std::string device = production::to_string(trainer.backend().device());
#endif
    return "production<" + device + ", " + arithmetic + ">, " +
           layout_text(trainer.config()) + ranks_.transport_text() +
           (trainer.distributed_optimizer() ? ", distributed optimizer" : "") +
           (trainer.overlaps_grad_reduce() ? ", overlapped gradient reduce in " +
                                                 std::to_string(trainer.shards().buckets.size()) + " bucket(s)"
                                           : "") +
           (trainer.overlaps_param_gather() ? " and weight gather" : "") +
           (trainer.overlaps_grad_reduce() ? std::string(" (") + trainer.lane_description() + ")" : "");
  }
  Precision precision() const override {
    if (production::kSemanticBuild) return fp64();
    return ranks_.front().config().optimizer.bf16 ? bf16() : fp32();
  }
  IterationRecord run_iteration() override {
    std::vector<IterationRecord> records(ranks_.size());
    ranks_.each([&](production::Trainer& trainer, int rank) {
      records[static_cast<std::size_t>(rank)] = trainer.run_iteration();
    });
    last_record_ = records.front();
    return last_record_;
  }
  TwinState state() const override {
    std::vector<production::HostState> states(ranks_.size());
    ranks_.each([&](const production::Trainer& trainer, int rank) {
      states[static_cast<std::size_t>(rank)] = trainer.host_state();
    });
    const production::HostState& s = states.front();
    return {widen(s.params), widen(s.exp_avg), widen(s.exp_avg_sq), s.counters};
  }
  void load_state(const TwinState& state) override {
    production::HostState s;
    s.params.resize(state.params.size());  // rounded to Real
    s.exp_avg.resize(state.exp_avg.size());
    s.exp_avg_sq.resize(state.exp_avg_sq.size());
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      s.params[i] = static_cast<Real>(state.params[i]);
      s.exp_avg[i] = static_cast<Real>(state.exp_avg[i]);
      s.exp_avg_sq[i] = static_cast<Real>(state.exp_avg_sq[i]);
    }
    s.counters = state.counters;
    ranks_.each([&](production::Trainer& trainer, int) { trainer.restore(s); });
  }
  // The trainer keeps the pre-clip gradient; the optimizer used it scaled by the Real coefficient
  // (ScaleParams: values[i] *= Real(coeff)), which is repeated here in Real.
  std::vector<double> last_gradient() const override {
    const std::vector<Real>& pre_clip = ranks_.front().last_gradient();
    std::vector<double> out(pre_clip.size());
    const Real coeff = static_cast<Real>(last_record_.clip_coeff);
    for (std::size_t i = 0; i < pre_clip.size(); ++i) {
      out[i] = last_record_.clipped ? static_cast<double>(pre_clip[i] * coeff)
                                    : static_cast<double>(pre_clip[i]);
    }
    return out;
  }
  // Production consumes the shipped Sample as the provider builds it (no device-side rebuild).
  Sample consumed_sample(std::int64_t global_index) const override { return samples_(global_index); }
  // The production run's own path: one rank writes format 1; DP ranks each write their shard and
  // each reads only its range back (production/checkpointing.hpp). The semantic and cuda-sim
  // builds have no checkpoints (their kinds say so: TwinKind::checkpoints).
  void save_checkpoint(const std::filesystem::path& directory) const override {
#if !defined(TANDEM_TWIN_CHECKPOINTS)
    (void)directory;
    throw std::logic_error("this build's production twin does not checkpoint");
#else
    const std::filesystem::path agreed = agreed_directory(directory);
    ranks_.each([&](const production::Trainer& trainer, int) { production::save_trainer_checkpoint(trainer, agreed); });
#endif
  }
  void resume_from(const std::filesystem::path& directory) override {
#if !defined(TANDEM_TWIN_CHECKPOINTS)
    (void)directory;
    throw std::logic_error("this build's production twin does not checkpoint");
#else
    const std::filesystem::path agreed = agreed_directory(directory);
    ranks_.each([&](production::Trainer& trainer, int) { production::resume_trainer_from(trainer, agreed); });
#endif
  }

 private:
  static production::ProductionOptions options(const TwinSetup& setup, bool cuda,
                                               production::ProductionMutants mutants) {
    production::ProductionOptions out;
    out.device = cuda ? production::Device::cuda : production::Device::cpu;
    production::FaultSchedule faults;
    faults.nonfinite_gradient_iterations = setup.nonfinite_gradient_iterations;
    faults.nonfinite_loss_iterations = setup.nonfinite_loss_iterations;
    faults.nonfinite_loss_value = setup.nonfinite_loss_value;
    out.hooks = production::make_test_hooks(faults, mutants);
    return out;
  }
  // As MPI ranks each process names its own scratch directory: they all use rank 0's.
  [[maybe_unused]] std::filesystem::path agreed_directory(const std::filesystem::path& directory) const {
    production::Collectives& collectives = ranks_.front().collectives();
    if (ranks_.on_threads() || collectives.size() == 1) return directory;
    return production::all_gather_strings(collectives, directory.string()).front();
  }

  reference::SampleProvider samples_;
  production::LocalRanks ranks_;
  IterationRecord last_record_;
};

// Production's fused AdamW on one element through its host twin, with the hyperparameters as
// production/kernels/optimizer.hpp documents them: computed in double, rounded to Real once.
AdamwElement production_adamw_element(const AdamwElementCall& call) {
  double beta1_power = 1.0;
  double beta2_power = 1.0;
  for (std::int64_t i = 0; i < call.step; ++i) {
    beta1_power *= call.optimizer.adam_beta1;
    beta2_power *= call.optimizer.adam_beta2;
  }
  production::AdamwHyper hyper;
  hyper.lr = static_cast<Real>(call.lr);
  hyper.weight_decay = static_cast<Real>(call.wd);
  hyper.beta1 = static_cast<Real>(call.optimizer.adam_beta1);
  hyper.beta2 = static_cast<Real>(call.optimizer.adam_beta2);
  hyper.one_minus_beta1 = static_cast<Real>(1.0 - call.optimizer.adam_beta1);
  hyper.one_minus_beta2 = static_cast<Real>(1.0 - call.optimizer.adam_beta2);
  hyper.eps = static_cast<Real>(call.optimizer.adam_eps);
  hyper.bias_correction1 = static_cast<Real>(1.0 - beta1_power);
  hyper.bias_correction2 = static_cast<Real>(1.0 - beta2_power);
  Real param = static_cast<Real>(call.before.param);
  Real exp_avg = static_cast<Real>(call.before.exp_avg);
  Real exp_avg_sq = static_cast<Real>(call.before.exp_avg_sq);
  const Real grad = static_cast<Real>(call.grad);
  const production::DecaySegment segment{0, 1, true};
  production::AdamwParams params;
  params.params = &param;
  params.exp_avg = &exp_avg;
  params.exp_avg_sq = &exp_avg_sq;
  params.grads = &grad;
  params.count = 1;
  params.segments = &segment;
  params.segment_count = 1;
  params.hyper = hyper;
  production::adamw_host(params);
  return {param, exp_avg, exp_avg_sq};
}

// A production-side mutant as the production trainer's switches (production/step_hooks.hpp).
production::ProductionMutants production_mutants(std::optional<Mutant> mutant) {
  production::ProductionMutants mutants;
  if (!mutant) return mutants;
  mutants.unreduced_gradients = mutant == Mutant::unreduced_gradients;
  mutants.rank_local_loss_denominator = mutant == Mutant::rank_local_loss_denominator;
  mutants.shard_local_norm = mutant == Mutant::shard_local_norm;
  mutants.unsummed_sequence_parallel_gradients = mutant == Mutant::unsummed_sequence_parallel_gradients;
  mutants.replicated_counted_per_rank = mutant == Mutant::replicated_counted_per_rank;
  mutants.local_vocabulary_normalizer = mutant == Mutant::local_vocabulary_normalizer;
  mutants.row_parallel_summed_twice = mutant == Mutant::row_parallel_summed_twice;
  mutants.row_parallel_not_summed = mutant == Mutant::row_parallel_not_summed;
  mutants.tied_embedding_not_summed = mutant == Mutant::tied_embedding_not_summed;
  mutants.tied_embedding_counted_twice = mutant == Mutant::tied_embedding_counted_twice;
  mutants.stage_local_norm = mutant == Mutant::stage_local_norm;
  mutants.microbatches_out_of_order = mutant == Mutant::microbatches_out_of_order;
  mutants.last_stage_microbatch_loss = mutant == Mutant::last_stage_microbatch_loss;
  mutants.clip_without_epsilon = mutant == Mutant::production_clip_without_epsilon;
  mutants.adam_epsilon_scaled_by_bias_correction = mutant == Mutant::adam_epsilon_scaled_by_bias_correction;
  mutants.loss_scale_one_part_in_a_billion = mutant == Mutant::loss_scale_one_part_in_a_billion;
  mutants.norm_squares_summed_in_fp32 = mutant == Mutant::norm_squares_summed_in_fp32;
  return mutants;
}

ProductionTwinMaker maker(bool cuda, RankTransport transport, std::optional<Mutant> mutant) {
  ProductionTwinMaker out;
  const production::ProductionMutants mutants = production_mutants(mutant);
  out.make = [cuda, transport, mutants](const TwinSetup& setup) -> std::unique_ptr<Twin> {
    if (!production::kSemanticBuild) return std::make_unique<ProductionTwin>(setup, cuda, transport, mutants);
    // The semantic build has no bf16 (production/arithmetic.hpp): the case runs in fp64 compute,
    // which the reference's semantics do not distinguish (SPEC 7's bf16 is a precision).
    TwinSetup wide = setup;
    wide.config.optimizer.bf16 = false;
    return std::make_unique<ProductionTwin>(wide, cuda, transport, mutants);
  };
  if (!cuda && !mutant) out.adamw_element = production_adamw_element;
  return out;
}

}  // namespace

#if defined(TANDEM_PRODUCTION_SEMANTIC)
ProductionTwinMaker semantic_production_twin_maker(RankTransport transport, std::optional<Mutant> mutant) {
  return maker(false, transport, mutant);
}
#elif defined(TANDEM_PRODUCTION_CUDA_SIM)
ProductionTwinMaker cuda_sim_production_twin_maker(std::optional<Mutant> mutant) {
  return maker(true, RankTransport::threads, mutant);
}
#else
ProductionTwinMaker production_twin_maker(bool cuda, RankTransport transport, std::optional<Mutant> mutant) {
  return maker(cuda, transport, mutant);
}
#endif

}  // namespace tandem::equivalence
