// The reference twins and the mutants (twin.hpp).
#include "equivalence/twin.hpp"

#include <numeric>
#include <sstream>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "production/checkpointing.hpp"
#include "production/collectives/mpi.hpp"
#include "production/local_ranks.hpp"
#include "production/kernels/optimizer.hpp"
#include "production/trainer.hpp"
#include "equivalence/verdict.hpp"
#include "reference/adamw.hpp"
#include "reference/checkpointing.hpp"

namespace tandem::equivalence {
namespace {

using Float50 = boost::multiprecision::cpp_bin_float_50;

std::string layout_text(const RunConfig& config) {
  std::ostringstream text;
  text << "DP " << config.parallel.data_parallel << " x " << config.microbatches_per_replica()
       << " microbatches x mbs " << config.batch.micro_batch_size;
  return text.str();
}

template <class Real>
std::vector<double> widen(const std::vector<Real>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(values[i]);
  return out;
}

template <class Real>
void narrow_into(const std::vector<double>& values, std::vector<Real>& out) {
  if (values.size() != out.size()) {
    throw std::invalid_argument("load_state: " + std::to_string(values.size()) +
                                " elements for a state of " + std::to_string(out.size()));
  }
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = Real(values[i]);
}

template <class Real>
class ReferenceTwin final : public Twin {
 public:
  ReferenceTwin(const TwinSetup& setup, reference::Mutants mutants,
                std::optional<Mutant> data_mutant, std::string name)
      : samples_(make_provider(setup.samples, data_mutant)),
        trainer_(setup.config, samples_, switches(setup, mutants)),
        name_(std::move(name)) {}

  std::string description() const override { return name_ + ", " + layout_text(trainer_.config()); }
  Precision precision() const override {
    return std::is_same_v<Real, double> ? fp64() : float50();
  }
  IterationRecord run_iteration() override { return trainer_.run_iteration(); }
  TwinState state() const override {
    const auto& s = trainer_.state();
    return {widen(s.params), widen(s.exp_avg), widen(s.exp_avg_sq), s.counters};
  }
  void load_state(const TwinState& state) override {
    auto& s = trainer_.state();
    narrow_into(state.params, s.params);
    narrow_into(state.exp_avg, s.exp_avg);
    narrow_into(state.exp_avg_sq, s.exp_avg_sq);
    s.counters = state.counters;
  }
  std::vector<double> last_gradient() const override { return widen(trainer_.last_gradient()); }
  Sample consumed_sample(std::int64_t global_index) const override { return samples_(global_index); }
  void save_checkpoint(const std::filesystem::path& directory) const override {
    if constexpr (std::is_same_v<Real, double>) {
      checkpoint::save_checkpoint(directory, reference::make_checkpoint_state(trainer_));
    } else {
      (void)directory;
      throw std::logic_error("the 50-digit reference does not checkpoint");  // (checkpointing.hpp)
    }
  }
  void resume_from(const std::filesystem::path& directory) override {
    if constexpr (std::is_same_v<Real, double>) {
      reference::restore_checkpoint_state(trainer_, checkpoint::load_checkpoint(directory));
    } else {
      (void)directory;
      throw std::logic_error("the 50-digit reference does not checkpoint");
    }
  }

 private:
  static reference::SampleProvider make_provider(reference::SampleProvider samples,
                                                 std::optional<Mutant> data_mutant) {
    if (!data_mutant) return samples;
    return [samples = std::move(samples), mutant = *data_mutant](std::int64_t index) {
      return mutate_sample(mutant, samples(index));
    };
  }
  static reference::TestSwitches switches(const TwinSetup& setup, reference::Mutants mutants) {
    reference::TestSwitches out;
    out.nonfinite_gradient_iterations = setup.nonfinite_gradient_iterations;
    out.nonfinite_gradient_value = setup.nonfinite_gradient_value;
    out.nonfinite_gradient_element = setup.nonfinite_gradient_element;
    out.nonfinite_loss_iterations = setup.nonfinite_loss_iterations;
    out.nonfinite_loss_value = setup.nonfinite_loss_value;
    out.mutants = mutants;
    return out;
  }

  reference::SampleProvider samples_;
  reference::Trainer<Real> trainer_;
  std::string name_;
};

// The production trainer on a backend (production/trainer.hpp). Its main state is fp32, so the
// state crosses the interface widened exactly; its test switch makes flat element 0 NaN. With
// DP > 1 it runs one Trainer per rank: on threads of this process (thread_group.hpp), or, under
// `mpirun`, as this process's rank of MPI_COMM_WORLD (every rank runs the same case in
// lockstep; a DP 1 run, such as a direct global batch, runs in each process alone). Every call
// reaches every rank; rank 0 answers.
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
    return "production<" + production::to_string(trainer.backend().device()) + ", " +
           (trainer.compute_dtype() == production::DType::bf16 ? "bf16" : "fp32") + ">, " +
           layout_text(trainer.config()) + ranks_.transport_text() +
           (trainer.distributed_optimizer() ? ", distributed optimizer" : "") +
           (trainer.overlaps_grad_reduce() ? ", overlapped gradient reduce in " +
                                                 std::to_string(trainer.shards().buckets.size()) + " bucket(s)"
                                           : "") +
           (trainer.overlaps_param_gather() ? " and weight gather" : "") +
           (trainer.overlaps_grad_reduce() ? std::string(" (") + trainer.lane_description() + ")" : "");
  }
  Precision precision() const override {
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
    s.params.resize(state.params.size());  // rounded to fp32
    s.exp_avg.resize(state.exp_avg.size());
    s.exp_avg_sq.resize(state.exp_avg_sq.size());
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      s.params[i] = static_cast<float>(state.params[i]);
      s.exp_avg[i] = static_cast<float>(state.exp_avg[i]);
      s.exp_avg_sq[i] = static_cast<float>(state.exp_avg_sq[i]);
    }
    s.counters = state.counters;
    ranks_.each([&](production::Trainer& trainer, int) { trainer.restore(s); });
  }
  // The trainer keeps the pre-clip gradient; the optimizer used it scaled by the fp32 coefficient
  // (ScaleParams: values[i] *= float(coeff)), which is repeated here in fp32.
  std::vector<double> last_gradient() const override {
    const std::vector<float>& pre_clip = ranks_.front().last_gradient();
    std::vector<double> out(pre_clip.size());
    const float coeff = static_cast<float>(last_record_.clip_coeff);
    for (std::size_t i = 0; i < pre_clip.size(); ++i) {
      out[i] = last_record_.clipped ? static_cast<double>(pre_clip[i] * coeff)
                                    : static_cast<double>(pre_clip[i]);
    }
    return out;
  }
  // Production consumes the shipped Sample as the provider builds it (no device-side rebuild).
  Sample consumed_sample(std::int64_t global_index) const override { return samples_(global_index); }
  // The production run's own path: one rank writes format 1; DP ranks each write their shard and
  // each reads only its range back (production/checkpointing.hpp).
  void save_checkpoint(const std::filesystem::path& directory) const override {
    const std::filesystem::path agreed = agreed_directory(directory);
    ranks_.each([&](const production::Trainer& trainer, int) { production::save_trainer_checkpoint(trainer, agreed); });
  }
  void resume_from(const std::filesystem::path& directory) override {
    const std::filesystem::path agreed = agreed_directory(directory);
    ranks_.each([&](production::Trainer& trainer, int) { production::resume_trainer_from(trainer, agreed); });
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
  std::filesystem::path agreed_directory(const std::filesystem::path& directory) const {
    production::Collectives& collectives = ranks_.front().collectives();
    if (ranks_.on_threads() || collectives.size() == 1) return directory;
    return production::all_gather_strings(collectives, directory.string()).front();
  }

  reference::SampleProvider samples_;
  production::LocalRanks ranks_;
  IterationRecord last_record_;
};

// Production's fused AdamW on one element through its host twin, with the hyperparameters as
// production/kernels/optimizer.hpp documents them: computed in double, rounded to fp32 once.
AdamwElement production_adamw_element(const AdamwElementCall& call) {
  double beta1_power = 1.0;
  double beta2_power = 1.0;
  for (std::int64_t i = 0; i < call.step; ++i) {
    beta1_power *= call.optimizer.adam_beta1;
    beta2_power *= call.optimizer.adam_beta2;
  }
  production::AdamwHyper hyper;
  hyper.lr = static_cast<float>(call.lr);
  hyper.weight_decay = static_cast<float>(call.wd);
  hyper.beta1 = static_cast<float>(call.optimizer.adam_beta1);
  hyper.beta2 = static_cast<float>(call.optimizer.adam_beta2);
  hyper.one_minus_beta1 = static_cast<float>(1.0 - call.optimizer.adam_beta1);
  hyper.one_minus_beta2 = static_cast<float>(1.0 - call.optimizer.adam_beta2);
  hyper.eps = static_cast<float>(call.optimizer.adam_eps);
  hyper.bias_correction1 = static_cast<float>(1.0 - beta1_power);
  hyper.bias_correction2 = static_cast<float>(1.0 - beta2_power);
  float param = static_cast<float>(call.before.param);
  float exp_avg = static_cast<float>(call.before.exp_avg);
  float exp_avg_sq = static_cast<float>(call.before.exp_avg_sq);
  const float grad = static_cast<float>(call.grad);
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

// The reference's AdamW on one element, optionally mutated as the trainer mutates it.
AdamwElement reference_adamw_element(const AdamwElementCall& call, const reference::Mutants& mutants) {
  const reference::AdamHyper<double> hyper(call.optimizer, mutants.bias_correction_off_by_one
                                                               ? call.step + 1
                                                               : call.step);
  AdamwElement out = call.before;
  if (mutants.l2_instead_of_decoupled || mutants.eps_inside_sqrt) {
    reference::adamw_update_mutated(hyper, call.lr, call.wd, call.grad, out.param, out.exp_avg,
                                    out.exp_avg_sq,
                                    {mutants.l2_instead_of_decoupled, mutants.eps_inside_sqrt});
  } else {
    reference::adamw_update(hyper, call.lr, call.wd, call.grad, out.param, out.exp_avg,
                            out.exp_avg_sq);
  }
  return out;
}

reference::Mutants trainer_mutants(Mutant mutant) {
  reference::Mutants m;
  switch (mutant) {
    case Mutant::decay_norm_weights: m.decay_norm_weights = true; break;
    case Mutant::l2_instead_of_decoupled: m.l2_instead_of_decoupled = true; break;
    case Mutant::clip_per_rank: m.clip_per_rank = true; break;
    case Mutant::microbatch_mean_under_per_token: m.microbatch_mean_under_per_token = true; break;
    case Mutant::eps_inside_sqrt: m.eps_inside_sqrt = true; break;
    case Mutant::bias_correction_off_by_one: m.bias_correction_off_by_one = true; break;
    case Mutant::scheduler_advances_on_skip: m.scheduler_advances_on_skip = true; break;
    case Mutant::clip_without_epsilon: m.clip_without_epsilon = true; break;
    case Mutant::cross_document_attention:
    case Mutant::positions_not_reset: break;  // data-side
    case Mutant::unreduced_gradients:
    case Mutant::rank_local_loss_denominator:
    case Mutant::shard_local_norm:
    case Mutant::unsummed_sequence_parallel_gradients:
    case Mutant::replicated_counted_per_rank:
    case Mutant::local_vocabulary_normalizer:
    case Mutant::row_parallel_summed_twice:
    case Mutant::row_parallel_not_summed:
    case Mutant::tied_embedding_not_summed:
    case Mutant::tied_embedding_counted_twice:
    case Mutant::stage_local_norm:
    case Mutant::microbatches_out_of_order:
    case Mutant::last_stage_microbatch_loss: break;  // production-side
  }
  return m;
}

bool is_data_side(Mutant mutant) {
  return mutant == Mutant::cross_document_attention || mutant == Mutant::positions_not_reset;
}

}  // namespace

std::vector<Mutant> all_mutants() {
  return {Mutant::decay_norm_weights,         Mutant::l2_instead_of_decoupled,
          Mutant::clip_per_rank,              Mutant::microbatch_mean_under_per_token,
          Mutant::eps_inside_sqrt,            Mutant::bias_correction_off_by_one,
          Mutant::scheduler_advances_on_skip, Mutant::clip_without_epsilon,
          Mutant::cross_document_attention,   Mutant::positions_not_reset,
          Mutant::unreduced_gradients,
          Mutant::rank_local_loss_denominator, Mutant::shard_local_norm,
          Mutant::unsummed_sequence_parallel_gradients, Mutant::replicated_counted_per_rank,
          Mutant::local_vocabulary_normalizer, Mutant::row_parallel_summed_twice,
          Mutant::row_parallel_not_summed, Mutant::tied_embedding_not_summed,
          Mutant::tied_embedding_counted_twice, Mutant::stage_local_norm,
          Mutant::microbatches_out_of_order, Mutant::last_stage_microbatch_loss};
}

std::string to_string(Mutant mutant) {
  switch (mutant) {
    case Mutant::decay_norm_weights: return "decay_norm_weights";
    case Mutant::l2_instead_of_decoupled: return "l2_instead_of_decoupled";
    case Mutant::clip_per_rank: return "clip_per_rank";
    case Mutant::microbatch_mean_under_per_token: return "microbatch_mean_under_per_token";
    case Mutant::eps_inside_sqrt: return "eps_inside_sqrt";
    case Mutant::bias_correction_off_by_one: return "bias_correction_off_by_one";
    case Mutant::scheduler_advances_on_skip: return "scheduler_advances_on_skip";
    case Mutant::clip_without_epsilon: return "clip_without_epsilon";
    case Mutant::cross_document_attention: return "cross_document_attention";
    case Mutant::positions_not_reset: return "positions_not_reset";
    case Mutant::unreduced_gradients: return "unreduced_gradients";
    case Mutant::rank_local_loss_denominator: return "rank_local_loss_denominator";
    case Mutant::shard_local_norm: return "shard_local_norm";
    case Mutant::unsummed_sequence_parallel_gradients: return "unsummed_sequence_parallel_gradients";
    case Mutant::tied_embedding_not_summed: return "tied_embedding_not_summed";
    case Mutant::tied_embedding_counted_twice: return "tied_embedding_counted_twice";
    case Mutant::replicated_counted_per_rank: return "replicated_counted_per_rank";
    case Mutant::local_vocabulary_normalizer: return "local_vocabulary_normalizer";
    case Mutant::row_parallel_summed_twice: return "row_parallel_summed_twice";
    case Mutant::row_parallel_not_summed: return "row_parallel_not_summed";
    case Mutant::stage_local_norm: return "stage_local_norm";
    case Mutant::microbatches_out_of_order: return "microbatches_out_of_order";
    case Mutant::last_stage_microbatch_loss: return "last_stage_microbatch_loss";
  }
  return "?";
}

Sample mutate_sample(Mutant mutant, Sample sample) {
  if (mutant == Mutant::cross_document_attention) {
    // Every position attends back to the window's start, across documents (SPEC 3 broken).
    std::fill(sample.attention_start.begin(), sample.attention_start.end(), 0);
  } else if (mutant == Mutant::positions_not_reset) {
    // Positions count 0..L-1 through EODs (SPEC 3 broken).
    std::iota(sample.positions.begin(), sample.positions.end(), 0);
  }
  return sample;
}

TwinKind reference_twin() {
  TwinKind kind;
  kind.name = "reference-double";
  kind.description = "reference<double> (reference/trainer.hpp)";
  kind.precision = fp64();
  kind.checkpoints = true;
  kind.make = [](const TwinSetup& setup) -> std::unique_ptr<Twin> {
    return std::make_unique<ReferenceTwin<double>>(setup, reference::Mutants{}, std::nullopt,
                                                   "reference<double>");
  };
  kind.adamw_element = [](const AdamwElementCall& call) {
    return reference_adamw_element(call, reference::Mutants{});
  };
  return kind;
}

TwinKind reference50_twin() {
  TwinKind kind;
  kind.name = "reference-float50";
  kind.description = "reference<cpp_bin_float_50> (50 significant digits)";
  kind.precision = float50();
  kind.make = [](const TwinSetup& setup) -> std::unique_ptr<Twin> {
    return std::make_unique<ReferenceTwin<Float50>>(setup, reference::Mutants{}, std::nullopt,
                                                    "reference<float50>");
  };
  return kind;
}

Precision precision_of(const TwinKind& kind, const RunConfig& config) {
  return kind.compute_follows_bf16 && config.optimizer.bf16 ? bf16() : kind.precision;
}

TwinKind production_twin(bool cuda, RankTransport transport) {
  TwinKind kind;
  kind.name = std::string(cuda ? "production-cuda" : "production-cpu") +
              (transport == RankTransport::mpi ? "-mpi" : "");
  kind.description = std::string("production trainer (production/trainer.hpp), ") +
                     (cuda ? "cuda" : "cpu") + " backend, fp32 main state" +
                     (transport == RankTransport::mpi ? ", TP x PP x DP = the MPI ranks" : "");
  kind.precision = fp32();
  kind.compute_follows_bf16 = true;
  kind.checkpoints = true;
  // Ranks on threads share host memory: the cpu backend. On cuda, ranks are processes (NCCL).
  kind.max_data_parallel = cuda && transport == RankTransport::threads ? 1 : 0;
  // Under mpirun the run's TP x PP x DP ranks are the MPI ranks (the rank grid's sub-communicators).
  kind.required_world_size = transport == RankTransport::mpi ? mpi_world_size() : 0;
  // One GPU: no tensor parallelism on cuda yet (two ranks need two devices or NCCL on one).
  kind.max_tensor_parallel = cuda ? 1 : 0;
  kind.max_pipeline_parallel = cuda ? 1 : 0;  // likewise for pipeline stages
  kind.injects_any_value = false;  // production::FaultSchedule: NaN at element 0
  kind.make = [cuda, transport](const TwinSetup& setup) -> std::unique_ptr<Twin> {
    return std::make_unique<ProductionTwin>(setup, cuda, transport);
  };
  if (!cuda) kind.adamw_element = production_adamw_element;
  return kind;
}

bool cuda_device_answers() {
  if (!production::cuda_backend_built()) return false;
  try {
    return production::make_backend(production::Device::cuda) != nullptr;
  } catch (const std::exception&) {
    return false;
  }
}

TwinKind production_cuda_ranks_twin() {
  TwinKind kind = production_twin(true, RankTransport::threads);
  kind.name = "production-cuda-ranks";
  kind.description = "production trainer (production/trainer.hpp), cuda backend, fp32 main state, TP x DP "
                     "ranks on threads sharing the one GPU (exchanges staged through host memory)";
  kind.max_data_parallel = 2;  // a few ranks per GPU: each holds a backend, its stream and handles
  kind.max_tensor_parallel = 0;
  kind.max_pipeline_parallel = 2;
  return kind;
}

std::vector<TwinKind> twins_under_test() {
  std::vector<TwinKind> kinds = {reference_twin(), production_twin(false)};
  if (cuda_device_answers()) {
    kinds.push_back(production_twin(true));
    kinds.push_back(production_cuda_ranks_twin());
  }
  return kinds;
}

static bool is_tensor_parallel_side(Mutant mutant) {
  return mutant == Mutant::unsummed_sequence_parallel_gradients || mutant == Mutant::replicated_counted_per_rank ||
         mutant == Mutant::local_vocabulary_normalizer || mutant == Mutant::row_parallel_summed_twice ||
         mutant == Mutant::row_parallel_not_summed;
}

static bool is_pipeline_parallel_side(Mutant mutant) {
  return mutant == Mutant::tied_embedding_not_summed || mutant == Mutant::tied_embedding_counted_twice ||
         mutant == Mutant::stage_local_norm || mutant == Mutant::microbatches_out_of_order ||
         mutant == Mutant::last_stage_microbatch_loss;
}

bool is_production_side(Mutant mutant) {
  return mutant == Mutant::unreduced_gradients || mutant == Mutant::rank_local_loss_denominator ||
         mutant == Mutant::shard_local_norm || is_tensor_parallel_side(mutant) || is_pipeline_parallel_side(mutant);
}

TwinKind mutant_twin(Mutant mutant, bool at_production_tolerance) {
  if (is_production_side(mutant)) {
    // The production trainer itself, on 2 ranks (threads), with one data- or tensor-parallel bug.
    production::ProductionMutants mutants;
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
    TwinKind kind = production_twin(false);
    kind.name = "mutant-" + to_string(mutant);
    const bool tensor = is_tensor_parallel_side(mutant);
    const bool pipeline = is_pipeline_parallel_side(mutant);
    kind.description = "production trainer (cpu, 2 " +
                       std::string(tensor ? "tensor" : pipeline ? "pipeline" : "data") +
                       "-parallel ranks) with the mutant " + to_string(mutant);
    if (pipeline) {
      kind.required_pipeline_parallel = 2;
    } else if (tensor) {
      kind.required_tensor_parallel = 2;
      kind.requires_sequence_parallel = mutant == Mutant::unsummed_sequence_parallel_gradients;
    } else {
      kind.required_data_parallel = 2;
    }
    kind.adamw_element = nullptr;
    kind.make = [mutants](const TwinSetup& setup) -> std::unique_ptr<Twin> {
      return std::make_unique<ProductionTwin>(setup, false, RankTransport::threads, mutants);
    };
    return kind;
  }
  TwinKind kind;
  kind.name = "mutant-" + to_string(mutant) + (at_production_tolerance ? "-at-fp32-bounds" : "");
  kind.description = "reference<double> with the mutant " + to_string(mutant) +
                     (at_production_tolerance ? ", held to fp32/bf16 bounds" : "");
  kind.precision = at_production_tolerance ? fp32() : fp64();
  kind.compute_follows_bf16 = at_production_tolerance;
  kind.checkpoints = true;
  const reference::Mutants mutants = trainer_mutants(mutant);
  const std::optional<Mutant> data_mutant =
      is_data_side(mutant) ? std::optional<Mutant>(mutant) : std::nullopt;
  kind.make = [mutants, data_mutant, name = kind.name](const TwinSetup& setup) -> std::unique_ptr<Twin> {
    return std::make_unique<ReferenceTwin<double>>(setup, mutants, data_mutant, name);
  };
  kind.adamw_element = [mutants](const AdamwElementCall& call) {
    return reference_adamw_element(call, mutants);
  };
  return kind;
}

}  // namespace tandem::equivalence
