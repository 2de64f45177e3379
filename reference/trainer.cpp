// The reference trainer's iteration (trainer.hpp), instantiated for double and cpp_bin_float_50.
#include "reference/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include "core/init.hpp"
#include "core/schedule.hpp"
#include "reference/adamw.hpp"
#include "reference/model.hpp"

namespace tandem::reference {

template <class Real>
Trainer<Real>::Trainer(const RunConfig& config, SampleProvider samples, TestSwitches switches)
    : config_(config),
      layout_(make_model_layout(config.model)),
      samples_(std::move(samples)),
      switches_(std::move(switches)) {
  const auto elements = static_cast<std::size_t>(layout_.total_elements);
  // SPEC 4: values drawn as fp32, widened exactly, so iteration 0 is bit-identical everywhere.
  const std::vector<float> initial = initial_parameters(config_.model, config_.data.seed);
  state_.params.assign(initial.begin(), initial.end());
  state_.exp_avg.assign(elements, Real(0));
  state_.exp_avg_sq.assign(elements, Real(0));
  replica_grads_.assign(static_cast<std::size_t>(config_.parallel.data_parallel),
                        std::vector<Real>(elements, Real(0)));
  reduced_grads_.assign(elements, Real(0));
}

template <class Real>
std::vector<Sample> Trainer<Real>::microbatch_samples(const SampleProvider& source,
                                                      std::int64_t consumed,
                                                      std::int64_t microbatch,
                                                      std::int64_t replica) const {
  const std::int64_t mbs = config_.batch.micro_batch_size;
  const std::int64_t dp = config_.parallel.data_parallel;
  // SPEC 2: microbatch m on DP rank r takes consumed + m*mbs*DP + r*mbs + [0, mbs).
  const std::int64_t first = consumed + microbatch * mbs * dp + replica * mbs;
  std::vector<Sample> batch;
  batch.reserve(static_cast<std::size_t>(mbs));
  for (std::int64_t j = 0; j < mbs; ++j) batch.push_back(source(first + j));
  return batch;
}

template <class Real>
EvaluationRecord Trainer<Real>::evaluate(const SampleProvider& validation, std::int64_t batches) {
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t gbs = config_.batch.global_batch_size;
  const std::int64_t dp = config_.parallel.data_parallel;
  const std::int64_t microbatches = config_.microbatches_per_replica();
  auto& counters = state_.counters;
  EvaluationRecord record;
  record.iteration = counters.iteration;
  Real loss_sum = Real(0);  // over every batch, microbatches in training's order (m, then r)
  for (std::int64_t batch = 0; batch < batches; ++batch) {
    for (std::int64_t m = 0; m < microbatches; ++m) {
      for (std::int64_t r = 0; r < dp; ++r) {
        const auto samples = microbatch_samples(validation, counters.consumed_valid_samples, m, r);
        const auto result = forward_loss<Real>(config_.model, layout_, state_.params, samples);
        loss_sum += result.masked_loss_sum;
        record.loss_tokens += result.loss_tokens;
      }
    }
    counters.consumed_valid_samples += gbs;  // Megatron: per evaluation batch
    record.samples += gbs;
  }
  last_evaluation_loss_ = record.loss_tokens > 0 ? loss_sum / Real(record.loss_tokens) : Real(0);
  record.loss = static_cast<double>(last_evaluation_loss_);
  record.ppl = evaluation_perplexity(record.loss);
  record.consumed_valid_samples = counters.consumed_valid_samples;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return record;
}

// SPEC 2: the global batch, microbatch m of replica r as Megatron's sampler hands it out; SPEC 5:
// its token counts (the loss tokens are the per-token denominator).
template <class Real>
typename Trainer<Real>::GlobalBatch Trainer<Real>::read_global_batch(std::int64_t consumed) const {
  const std::int64_t dp = config_.parallel.data_parallel;
  const std::int64_t microbatches = config_.microbatches_per_replica();
  GlobalBatch batch;
  batch.microbatches.resize(static_cast<std::size_t>(microbatches));
  for (std::int64_t m = 0; m < microbatches; ++m) {
    for (std::int64_t r = 0; r < dp; ++r) {
      batch.microbatches[static_cast<std::size_t>(m)].push_back(microbatch_samples(samples_, consumed, m, r));
      for (const Sample& sample : batch.microbatches[static_cast<std::size_t>(m)].back()) {
        batch.input_tokens += sample.input_tokens;
        batch.loss_tokens += sample.loss_tokens;
        batch.pad_tokens += sample.pad_tokens;
      }
    }
  }
  return batch;
}

// SPEC 5 per-token: gradients of (sum of masked CE / loss tokens of the global batch).
// Microbatch-mean: each microbatch's masked mean, averaged over microbatches and replicas; a
// microbatch without loss tokens contributes 0 and still counts in the average (Megatron).
template <class Real>
Real Trainer<Real>::loss_scale(const GlobalBatch& batch, std::int64_t microbatch_loss_tokens) const {
  const bool per_token = config_.data.loss_normalization == LossNormalization::per_token &&
                         !switches_.mutants.microbatch_mean_under_per_token;  // test-only mutant
  if (per_token && batch.loss_tokens > 0) return Real(1) / Real(batch.loss_tokens);
  if (!per_token && microbatch_loss_tokens > 0) {
    return Real(1) / (Real(microbatch_loss_tokens) * Real(config_.microbatches_per_replica()) *
                      Real(config_.parallel.data_parallel));
  }
  return Real(0);
}

// SPEC 5: forward/backward of every microbatch of every replica into that replica's gradient
// buffer. Returns the masked CE summed over the global batch in Real (microbatches m, then r).
template <class Real>
Real Trainer<Real>::forward_backward(const GlobalBatch& batch) {
  Real loss_sum = Real(0);
  for (auto& grads : replica_grads_) std::fill(grads.begin(), grads.end(), Real(0));
  for (std::size_t m = 0; m < batch.microbatches.size(); ++m) {
    for (std::size_t r = 0; r < batch.microbatches[m].size(); ++r) {
      const auto& samples = batch.microbatches[m][r];
      std::int64_t microbatch_loss_tokens = 0;
      for (const Sample& sample : samples) microbatch_loss_tokens += sample.loss_tokens;
      const auto result = reference::forward_backward<Real>(config_.model, layout_, state_.params, samples,
                                                            loss_scale(batch, microbatch_loss_tokens),
                                                            replica_grads_[r]);
      loss_sum += result.masked_loss_sum;
    }
  }
  return loss_sum;
}

// SPEC 1: the replicas' gradients added in rank order, what the reduction across DP must
// produce; then the test switch's injected value (SPEC 8 tests).
template <class Real>
void Trainer<Real>::reduce_over_replicas(std::int64_t iteration) {
  if (switches_.mutants.clip_per_rank) clip_each_replica_mutant();  // test-only mutant
  std::fill(reduced_grads_.begin(), reduced_grads_.end(), Real(0));
  for (const auto& grads : replica_grads_) {
    for (std::size_t i = 0; i < reduced_grads_.size(); ++i) reduced_grads_[i] += grads[i];
  }
  if (switches_.nonfinite_gradient_iterations.count(iteration) != 0) {
    reduced_grads_.at(static_cast<std::size_t>(switches_.nonfinite_gradient_element)) =
        Real(switches_.nonfinite_gradient_value);
  }
}

// SPEC 5: the logged loss is always the global token-weighted mean; 0 without loss tokens.
template <class Real>
Real Trainer<Real>::global_loss(const Real& loss_sum, const GlobalBatch& batch, std::int64_t iteration) const {
  if (switches_.nonfinite_loss_iterations.count(iteration) != 0) return Real(switches_.nonfinite_loss_value);
  return batch.loss_tokens > 0 ? loss_sum / Real(batch.loss_tokens) : Real(0);
}

// SPEC 6: the global norm over every unique parameter element (the flat buffer holds each once).
template <class Real>
Real Trainer<Real>::gradient_norm() const {
  using std::sqrt;
  Real sum_of_squares = Real(0);
  for (const Real& g : reduced_grads_) sum_of_squares += g * g;
  return sqrt(sum_of_squares);
}

// SPEC 6: coeff = clip / (norm + 1e-6), applied when below 1. Returns the factor applied.
template <class Real>
Real Trainer<Real>::clip(const Real& grad_norm, IterationRecord& record) {
  if (config_.optimizer.clip_grad <= 0.0) return Real(1);
  const Real epsilon = switches_.mutants.clip_without_epsilon ? Real(0) : Real(kClipNormEpsilon);  // test-only mutant
  const Real coeff = Real(config_.optimizer.clip_grad) / (grad_norm + epsilon);
  if (!(coeff < Real(1))) return Real(1);
  record.clipped = true;
  for (Real& g : reduced_grads_) g *= coeff;
  return coeff;
}

// SPEC 7: AdamW over every element, step t = successful updates including this one; the audited
// elements' entries into the record.
template <class Real>
void Trainer<Real>::adamw(std::int64_t step, const Real& lr, const Real& wd, IterationRecord& record) {
  const AdamHyper<Real> hyper(config_.optimizer,
                              switches_.mutants.bias_correction_off_by_one ? step + 1 : step);  // test-only mutant
  const AdamMutation adam_mutation{switches_.mutants.l2_instead_of_decoupled,
                                   switches_.mutants.eps_inside_sqrt};  // test-only mutants
  std::size_t next_audit = 0;
  for (const auto& tensor : layout_.tensors) {
    const bool decays = tensor.decay_group == DecayGroup::decay ||
                        switches_.mutants.decay_norm_weights;  // test-only mutant
    const Real tensor_wd = decays ? wd : Real(0);
    for (std::int64_t e = 0; e < tensor.numel; ++e) {
      const auto i = static_cast<std::size_t>(tensor.offset + e);
      const bool audited = next_audit < audit_elements_.size() && audit_elements_[next_audit] == tensor.offset + e;
      AuditEntry entry;
      if (audited) {
        entry.tensor = tensor.name;
        entry.element = e;
        entry.group = to_string(tensor.decay_group);
        entry.old_value = static_cast<double>(state_.params[i]);
        entry.grad = static_cast<double>(reduced_grads_[i]);
        entry.old_m = static_cast<double>(state_.exp_avg[i]);
        entry.old_v = static_cast<double>(state_.exp_avg_sq[i]);
      }
      if (adam_mutation.l2_instead_of_decoupled || adam_mutation.eps_inside_sqrt) {
        adamw_update_mutated(hyper, lr, tensor_wd, reduced_grads_[i], state_.params[i], state_.exp_avg[i],
                             state_.exp_avg_sq[i], adam_mutation);
      } else {
        adamw_update(hyper, lr, tensor_wd, reduced_grads_[i], state_.params[i], state_.exp_avg[i],
                     state_.exp_avg_sq[i]);
      }
      if (audited) {
        entry.m = static_cast<double>(state_.exp_avg[i]);
        entry.v = static_cast<double>(state_.exp_avg_sq[i]);
        entry.lr = record.lr;
        entry.wd = static_cast<double>(tensor_wd);
        entry.step = step;
        entry.new_value = static_cast<double>(state_.params[i]);
        record.audit.push_back(entry);
        ++next_audit;
      }
    }
  }
}

// SPEC 8: the counters of a successful or a skipped update (a skip changes no parameter, moment,
// step or scheduler sample); SPEC 1/8: iteration and consumed samples advance either way.
template <class Real>
void Trainer<Real>::count_update(IterationRecord& record, bool successful) {
  const std::int64_t gbs = config_.batch.global_batch_size;
  auto& counters = state_.counters;
  if (successful) {
    counters.successful_updates += 1;
    counters.scheduler_samples += gbs;
    counters.consecutive_skips = 0;
  } else {
    record.update_successful = false;
    record.clip_coeff = 1.0;
    counters.skipped_updates += 1;
    counters.consecutive_skips += 1;
    if (switches_.mutants.scheduler_advances_on_skip) counters.scheduler_samples += gbs;  // test-only mutant
  }
  counters.iteration += 1;
  counters.consumed_samples += gbs;
  counters.input_tokens += record.input_tokens;
  counters.loss_tokens += record.loss_tokens;
  counters.pad_tokens += record.pad_tokens;
  record.step = counters.successful_updates;
  record.consumed_samples = counters.consumed_samples;
  record.totals = counters;
}

template <class Real>
IterationRecord Trainer<Real>::run_iteration() {
  using std::isfinite;
  const auto started = std::chrono::steady_clock::now();
  auto& counters = state_.counters;
  IterationRecord record;
  record.iteration = counters.iteration + 1;

  const GlobalBatch batch = read_global_batch(counters.consumed_samples);  // SPEC 2, 5
  record.input_tokens = batch.input_tokens;
  record.loss_tokens = batch.loss_tokens;
  record.pad_tokens = batch.pad_tokens;
  const Real loss_sum = forward_backward(batch);                           // SPEC 5
  reduce_over_replicas(record.iteration);                                  // SPEC 1
  last_loss_ = global_loss(loss_sum, batch, record.iteration);             // SPEC 5
  record.loss = static_cast<double>(last_loss_);
  const Real grad_norm = gradient_norm();                                  // SPEC 6
  record.grad_norm = static_cast<double>(grad_norm);
  // SPEC 8: the scheduler holds n = successful updates x GBS.
  const Real lr = learning_rate<Real>(config_.schedule, counters.scheduler_samples);
  const Real wd = weight_decay_at<Real>(config_.schedule, counters.scheduler_samples);
  record.lr = static_cast<double>(lr);
  record.wd = static_cast<double>(wd);

  const bool finite = isfinite(grad_norm) && isfinite(last_loss_);         // SPEC 8
  if (finite) {
    record.clip_coeff = static_cast<double>(clip(grad_norm, record));      // SPEC 6
    adamw(counters.successful_updates + 1, lr, wd, record);                // SPEC 7
  }
  count_update(record, finite);                                            // SPEC 8

  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  record.tokens_per_second =
      record.seconds > 0 ? static_cast<double>(record.input_tokens) / record.seconds : 0.0;
  return record;
}

// Test-only mutant (Mutants::clip_per_rank): each replica's gradient clipped by its own norm
// before the reduction, the bug SPEC 6's global norm rules out.
template <class Real>
void Trainer<Real>::clip_each_replica_mutant() {
  using std::sqrt;
  if (config_.optimizer.clip_grad <= 0.0) return;
  for (auto& grads : replica_grads_) {
    Real sum_of_squares = Real(0);
    for (const Real& g : grads) sum_of_squares += g * g;
    const Real coeff = Real(config_.optimizer.clip_grad) / (sqrt(sum_of_squares) + Real(kClipNormEpsilon));
    if (coeff < Real(1)) {
      for (Real& g : grads) g *= coeff;
    }
  }
}

template class Trainer<double>;
template class Trainer<boost::multiprecision::cpp_bin_float_50>;

}  // namespace tandem::reference
