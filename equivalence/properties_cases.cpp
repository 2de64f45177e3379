// The equivalence properties' cases (properties_internal.hpp): a drawn case mapped into the
// domain of the twin that runs it, its injections and schedule position set up, and its clip
// threshold placed against the reference's norm.
#include "equivalence/properties_internal.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model_layout.hpp"

namespace tandem::equivalence {
namespace {

// The same case with `factor` times the samples per update: every layout's microbatches and every
// sample count of the schedule scale together, so updates, positions and ratios are unchanged.
void scale_global_batch(UpdateCase& c, std::int64_t factor) {
  c.reference_layout.microbatches *= factor;
  c.test_layout.microbatches *= factor;
  ScheduleConfig& s = c.config.schedule;
  for (std::int64_t* samples : {&s.lr_warmup_samples, &s.lr_decay_samples, &s.train_samples, &s.wd_incr_samples}) {
    *samples *= factor;
  }
  c.config = with_layout(c.config, c.reference_layout);
}

}  // namespace

// The case as `kind` can run it, mapped into its domain rather than filtered: a one-rank twin
// runs the replicas' samples as more microbatches (the same global batch); a twin whose DP is
// fixed (the MPI ranks) gets a layout with that DP, the global batch scaled when it does not
// divide; and a twin that can only inject NaN at element 0 gets exactly that.
void adapt_to(const TwinKind& kind, UpdateCase& c) {
  std::int64_t required_data_parallel = kind.required_data_parallel;
  if (const std::int64_t world = kind.required_world_size; world > 0) {
    // The largest TP up to the drawn one that divides the world (the drawn TP splits the model,
    // so every power of two below it does too), then the largest PP that divides the rest (one
    // stage at least); the rest of the ranks are replicas.
    while (world % c.test_layout.tensor_parallel != 0) c.test_layout.tensor_parallel /= 2;
    c.test_layout.sequence_parallel = c.test_layout.sequence_parallel && c.test_layout.tensor_parallel > 1;
    while ((world / c.test_layout.tensor_parallel) % c.test_layout.pipeline_parallel != 0) {
      c.test_layout.pipeline_parallel /= 2;  // 4 -> 2 -> 1: each still divides the layers
    }
    if (c.test_layout.pipeline_parallel == 1) c.test_layout.virtual_stages = 1;
    required_data_parallel = world / c.test_layout.tensor_parallel / c.test_layout.pipeline_parallel;
  }
  if (const std::int64_t ranks = required_data_parallel; ranks > 0 && c.test_layout.data_parallel != ranks) {
    if (c.test_layout.global_batch_size() % ranks != 0) scale_global_batch(c, ranks);
    const std::int64_t per_rank = c.test_layout.global_batch_size() / ranks;
    const std::int64_t mbs = per_rank % c.test_layout.micro_batch_size == 0 ? c.test_layout.micro_batch_size : 1;
    c.test_layout = {mbs, per_rank / mbs, ranks, c.test_layout.tensor_parallel, c.test_layout.sequence_parallel,
                     c.test_layout.pipeline_parallel, c.test_layout.virtual_stages};
    if (c.config.data.loss_normalization == LossNormalization::microbatch_mean) {
      c.reference_layout = without_model_parallelism(c.test_layout);  // SPEC 5: microbatch-mean is not split-invariant
      c.config = with_layout(c.config, c.reference_layout);
    }
  }
  if (kind.max_data_parallel > 0 && c.test_layout.data_parallel > kind.max_data_parallel) {
    c.test_layout = {c.test_layout.micro_batch_size, c.test_layout.microbatches * c.test_layout.data_parallel, 1,
                     c.test_layout.tensor_parallel, c.test_layout.sequence_parallel,
                     c.test_layout.pipeline_parallel, c.test_layout.virtual_stages};
    if (c.config.data.loss_normalization == LossNormalization::microbatch_mean) {
      c.reference_layout = without_model_parallelism(c.test_layout);  // SPEC 5: microbatch-mean is not split-invariant
      c.config = with_layout(c.config, c.reference_layout);
    }
  }
  if (kind.max_tensor_parallel > 0 && c.test_layout.tensor_parallel > kind.max_tensor_parallel) {
    c.test_layout.tensor_parallel = kind.max_tensor_parallel;
    c.test_layout.sequence_parallel = c.test_layout.sequence_parallel && kind.max_tensor_parallel > 1;
  }
  if (const std::int64_t tp = kind.required_tensor_parallel; tp > 0) {
    // Mapped into the domain: a model that TP cannot split gets the nearest one it can (heads a
    // multiple of TP at the same head dimension, groups a multiple or a divisor of TP, F and the
    // vocabulary rounded up).
    ModelConfig& model = c.config.model;
    const std::int64_t head_dim = model.head_dim();
    if (model.num_attention_heads % tp != 0) model.num_attention_heads = tp;
    if (model.num_query_groups % tp != 0 && tp % model.num_query_groups != 0) {
      model.num_query_groups = model.num_attention_heads;
    }
    model.hidden_size = model.num_attention_heads * head_dim;
    model.ffn_hidden_size = (model.ffn_hidden_size + tp - 1) / tp * tp;
    model.padded_vocab_size = (model.padded_vocab_size + tp - 1) / tp * tp;
    c.test_layout.tensor_parallel = tp;
  }
  if (kind.requires_sequence_parallel) c.test_layout.sequence_parallel = true;
  if (kind.max_pipeline_parallel > 0 && c.test_layout.pipeline_parallel > kind.max_pipeline_parallel) {
    c.test_layout.pipeline_parallel = kind.max_pipeline_parallel;
    c.test_layout.virtual_stages = 1;
  }
  if (const std::int64_t pp = kind.required_pipeline_parallel; pp > 0) {
    // Mapped into the domain: layers a multiple of PP, and the tied embedding the pipeline
    // mutants break.
    ModelConfig& model = c.config.model;
    model.num_layers = (model.num_layers + pp - 1) / pp * pp;
    model.tie_embeddings = true;
    c.test_layout.pipeline_parallel = pp;
    c.test_layout.virtual_stages = 1;
  }
  c.test_layout = interleaving_kept_valid(c.test_layout);
  if (!kind.injects_any_value && c.injection.iteration > 0 && !c.injection.on_loss) {
    c.injection.value = std::numeric_limits<double>::quiet_NaN();
    c.injection.element = 0;
  }
}

// `injection.iteration` counts from the case's first update; the trainer counts iterations from
// the start of the run, which the schedule position moves (move_to_position).
TwinSetup setup_for(const RunConfig& config, const reference::SampleProvider& samples,
                    const Injection& injection, std::int64_t start_samples) {
  TwinSetup setup;
  setup.config = config;
  setup.samples = samples;
  if (injection.iteration > 0 && injection.on_loss) {
    setup.nonfinite_loss_iterations = {start_samples / config.batch.global_batch_size +
                                       injection.iteration};
    setup.nonfinite_loss_value = injection.value;
  } else if (injection.iteration > 0) {
    setup.nonfinite_gradient_iterations = {start_samples / config.batch.global_batch_size +
                                           injection.iteration};
    setup.nonfinite_gradient_value = injection.value;
    setup.nonfinite_gradient_element =
        injection.element % make_model_layout(config.model).total_elements;
  }
  return setup;
}

// The counters of a run that has made `samples / GBS` successful updates: the case's schedule
// position (SPEC 8), with the twin's own initial weights and zero moments.
void move_to_position(Twin& twin, std::int64_t samples, std::int64_t gbs) {
  TwinState state = twin.state();
  state.counters.iteration = samples / gbs;
  state.counters.successful_updates = samples / gbs;
  state.counters.consumed_samples = samples;
  state.counters.scheduler_samples = samples;
  twin.load_state(state);
}

// SPEC 6 threshold: clipping applies when clip < norm + 1e-6. A case "just above" or "just below"
// the threshold sits 4 norm bounds away from it, so the decision is the same in every arithmetic
// the bound covers (closer than the bound, the flag is undecidable and no twin can be held to it).
double clip_for(const UpdateCase& c, const RunConfig& config,
                const reference::SampleProvider& samples, const PrecisionPair& precisions) {
  if (c.clip == ClipMode::off) return 0.0;
  RunConfig probe_config = config;
  probe_config.optimizer.clip_grad = 0.0;
  auto probe = reference_twin().make(setup_for(probe_config, samples, {}, 0));
  move_to_position(*probe, starting_samples(c), config.batch.global_batch_size);
  const IterationRecord record = probe->run_iteration();
  const double norm = record.grad_norm;
  if (!(norm > 0) || !std::isfinite(norm)) return 1.0;  // nothing to place the threshold against
  double max_abs = 0;
  for (const double g : probe->last_gradient()) max_abs = std::max(max_abs, std::abs(g));
  const ReductionShape shape = reduction_shape(config);
  const double relative =
      norm_bound(shape, precisions, gradient_bound(shape, precisions, max_abs), norm) / norm;
  const double margin = std::min(0.25, 4 * relative);
  switch (c.clip) {
    case ClipMode::off: return 0.0;
    case ClipMode::inactive: return 4 * (norm + kClipNormEpsilon);
    case ClipMode::active: return (norm + kClipNormEpsilon) / 4;
    case ClipMode::just_above_threshold: return (norm + kClipNormEpsilon) * (1 + margin);
    case ClipMode::just_below_threshold: return (norm + kClipNormEpsilon) * (1 - margin);
  }
  return 0.0;
}

}  // namespace tandem::equivalence
