// The reference twins and the mutants (twin.hpp).
#include "equivalence/twin.hpp"

#include <numeric>
#include <sstream>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "core/model_layout.hpp"
#include "equivalence/production_twin.hpp"
#include "equivalence/verdict.hpp"
#include "production/backend.hpp"
#include "reference/adamw.hpp"
#include "reference/checkpointing.hpp"

namespace tandem::equivalence {
namespace {

using Float50 = boost::multiprecision::cpp_bin_float_50;

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
    case Mutant::last_stage_microbatch_loss:
    case Mutant::production_clip_without_epsilon:
    case Mutant::adam_epsilon_scaled_by_bias_correction:
    case Mutant::loss_scale_one_part_in_a_billion:
    case Mutant::norm_squares_summed_in_fp32: break;  // production-side
  }
  return m;
}

bool is_data_side(Mutant mutant) {
  return mutant == Mutant::cross_document_attention || mutant == Mutant::positions_not_reset;
}

}  // namespace

TwinState with_the_top_of_the_model_scaled(TwinState state, const ModelConfig& model, double factor) {
  if (model.tie_embeddings) {
    throw std::invalid_argument("with_the_top_of_the_model_scaled: a tied model's output layer is its embedding");
  }
  const ModelLayout layout = make_model_layout(model);
  for (const std::int64_t index : {layout.final_norm, layout.output}) {
    const ParameterTensor& tensor = layout.tensor(index);
    for (std::int64_t i = tensor.offset; i < tensor.offset + tensor.numel; ++i) {
      state.params.at(static_cast<std::size_t>(i)) *= factor;
    }
  }
  return state;
}

std::string layout_text(const RunConfig& config) {
  std::ostringstream text;
  text << "DP " << config.parallel.data_parallel << " x " << config.microbatches_per_replica()
       << " microbatches x mbs " << config.batch.micro_batch_size;
  return text.str();
}

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
          Mutant::microbatches_out_of_order, Mutant::last_stage_microbatch_loss,
          Mutant::production_clip_without_epsilon, Mutant::adam_epsilon_scaled_by_bias_correction,
          Mutant::loss_scale_one_part_in_a_billion, Mutant::norm_squares_summed_in_fp32};
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
    case Mutant::production_clip_without_epsilon: return "production_clip_without_epsilon";
    case Mutant::adam_epsilon_scaled_by_bias_correction: return "adam_epsilon_scaled_by_bias_correction";
    case Mutant::loss_scale_one_part_in_a_billion: return "loss_scale_one_part_in_a_billion";
    case Mutant::norm_squares_summed_in_fp32: return "norm_squares_summed_in_fp32";
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
  const ProductionTwinMaker maker = production_twin_maker(cuda, transport, std::nullopt);
  kind.make = maker.make;
  kind.adamw_element = maker.adamw_element;
  return kind;
}

TwinKind production_semantic_twin(RankTransport transport) {
  TwinKind kind;
  kind.name = std::string("production-semantic") + (transport == RankTransport::mpi ? "-mpi" : "");
  kind.description = std::string("production trainer (production/trainer.hpp) from its semantic build ") +
                     "(production/arithmetic.hpp: Real = double), cpu backend" +
                     (transport == RankTransport::mpi ? ", TP x PP x DP = the MPI ranks" : "");
  kind.precision = fp64();
  kind.checkpoints = false;
  kind.required_world_size = transport == RankTransport::mpi ? mpi_world_size() : 0;
  kind.injects_any_value = false;  // production::FaultSchedule: NaN at element 0
  const ProductionTwinMaker maker = semantic_production_twin_maker(transport, std::nullopt);
  kind.make = maker.make;
  kind.adamw_element = maker.adamw_element;
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
  std::vector<TwinKind> kinds = {reference_twin(), production_twin(false), production_semantic_twin()};
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

static bool is_semantic_side(Mutant mutant) {
  return mutant == Mutant::production_clip_without_epsilon || mutant == Mutant::adam_epsilon_scaled_by_bias_correction ||
         mutant == Mutant::loss_scale_one_part_in_a_billion;
}

bool is_precision_side(Mutant mutant) { return mutant == Mutant::norm_squares_summed_in_fp32; }

bool is_production_side(Mutant mutant) {
  return mutant == Mutant::unreduced_gradients || mutant == Mutant::rank_local_loss_denominator ||
         mutant == Mutant::shard_local_norm || is_tensor_parallel_side(mutant) || is_pipeline_parallel_side(mutant) ||
         is_semantic_side(mutant) || is_precision_side(mutant);
}

TwinKind production_cuda_sim_twin(std::optional<Mutant> mutant) {
  if (mutant && (!is_production_side(*mutant) || is_semantic_side(*mutant))) {
    throw std::invalid_argument("--test-mutant " + to_string(*mutant) +
                                " on cuda-sim: only the production trainer's own data-, tensor-, pipeline-parallel "
                                "and precision mutants switch on in its cuda build");
  }
  TwinKind kind;
  kind.name = mutant ? "mutant-" + to_string(*mutant) + "-cuda-sim" : "production-cuda-sim";
  kind.description = "production trainer (production/trainer.hpp), cuda backend on cuda-sim (the shipped CUDA "
                     "sources on the CPU, docs/CUDA-SIM.md), fp32 main state, TP x PP x DP ranks on threads of "
                     "this process sharing the one simulated device (exchanges staged through host memory)";
  kind.precision = fp32();
  kind.compute_follows_bf16 = true;
  kind.checkpoints = false;        // the cuda-sim build has no checkpointing (docs/CUDA-SIM.md "Not yet")
  kind.injects_any_value = false;  // production::FaultSchedule: NaN at element 0
  if (mutant) kind.description += ", with the mutant " + to_string(*mutant);
  const ProductionTwinMaker maker = cuda_sim_production_twin_maker(mutant);
  kind.make = maker.make;
  kind.adamw_element = maker.adamw_element;
  return kind;
}

TwinKind mutant_twin(Mutant mutant, bool at_production_tolerance) {
  if (is_production_side(mutant)) {
    if (is_semantic_side(mutant)) {
      // The semantic production trainer, on any layout, with one bug of a part in a million (or a
      // billion).
      TwinKind kind = production_semantic_twin();
      kind.name = "mutant-" + to_string(mutant);
      kind.description = "production trainer (the semantic build, cpu) with the mutant " + to_string(mutant);
      kind.adamw_element = nullptr;
      kind.make = semantic_production_twin_maker(RankTransport::threads, mutant).make;
      return kind;
    }
    TwinKind kind = production_twin(false);
    kind.name = "mutant-" + to_string(mutant);
    kind.adamw_element = nullptr;
    if (is_precision_side(mutant)) {
      // The production trainer (fp32 or bf16, any layout) with one rounding in the wrong precision.
      kind.description = "production trainer (cpu) with the mutant " + to_string(mutant);
      kind.make = production_twin_maker(false, RankTransport::threads, mutant).make;
      return kind;
    }
    // The production trainer itself, on 2 ranks (threads), with one data- or tensor-parallel bug.
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
    kind.make = production_twin_maker(false, RankTransport::threads, mutant).make;
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
