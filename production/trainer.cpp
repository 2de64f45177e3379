// The production trainer's iteration (trainer.hpp).
#include "production/trainer.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/init.hpp"
#include "core/schedule.hpp"

namespace tandem::production {
namespace {

// SPEC 6: coeff = clip_grad / (norm + 1e-6).
constexpr double kClipNormEpsilon = 1e-6;

void require_single_rank(const ParallelConfig& parallel) {
  const auto refuse = [](const char* name, std::int64_t value) {
    throw std::invalid_argument(std::string("production trainer: ") + name + " = " +
                                std::to_string(value) +
                                ", but this trainer runs one rank for now (multi-rank DP is the "
                                "next step); fix: set it to 1 or use --engine reference");
  };
  if (parallel.tensor_parallel != 1) refuse("--tensor-model-parallel-size", parallel.tensor_parallel);
  if (parallel.pipeline_parallel != 1) refuse("--pipeline-model-parallel-size", parallel.pipeline_parallel);
  if (parallel.context_parallel != 1) refuse("--context-parallel-size", parallel.context_parallel);
  if (parallel.data_parallel != 1) refuse("--data-parallel-size", parallel.data_parallel);
}

// SPEC 7's hyperparameters for step t in double, rounded to fp32 once.
AdamwHyper adamw_hyper(const OptimizerConfig& optimizer, std::int64_t step, double lr, double wd) {
  double beta1_power = 1.0;  // b^t by repeated multiplication, as the reference
  double beta2_power = 1.0;
  for (std::int64_t i = 0; i < step; ++i) {
    beta1_power *= optimizer.adam_beta1;
    beta2_power *= optimizer.adam_beta2;
  }
  AdamwHyper hyper;
  hyper.lr = static_cast<float>(lr);
  hyper.weight_decay = static_cast<float>(wd);
  hyper.beta1 = static_cast<float>(optimizer.adam_beta1);
  hyper.beta2 = static_cast<float>(optimizer.adam_beta2);
  hyper.one_minus_beta1 = static_cast<float>(1.0 - optimizer.adam_beta1);
  hyper.one_minus_beta2 = static_cast<float>(1.0 - optimizer.adam_beta2);
  hyper.eps = static_cast<float>(optimizer.adam_eps);
  hyper.bias_correction1 = static_cast<float>(1.0 - beta1_power);
  hyper.bias_correction2 = static_cast<float>(1.0 - beta2_power);
  return hyper;
}

}  // namespace

std::vector<DecaySegment> decay_segments(const ModelLayout& layout) {
  std::vector<DecaySegment> segments;
  for (const ParameterTensor& tensor : layout.tensors) {
    const bool decay = tensor.decay_group == DecayGroup::decay;
    if (!segments.empty() && segments.back().decay == decay &&
        segments.back().begin + segments.back().count == tensor.offset) {
      segments.back().count += tensor.numel;
    } else {
      segments.push_back(DecaySegment{tensor.offset, tensor.numel, decay});
    }
  }
  return segments;
}

double model_flops(const ModelConfig& config, const std::vector<Sample>& samples) {
  const double d = static_cast<double>(config.hidden_size);
  const double query_width = static_cast<double>(config.num_attention_heads * config.head_dim());
  const double kv_width = static_cast<double>(config.kv_width());
  const double ffn = static_cast<double>(config.ffn_hidden_size);
  const double vocab = static_cast<double>(config.padded_vocab_size);
  // Matrix parameters touched per position: q, k, v, o, gate, up, down per layer; the output.
  const double per_layer = d * query_width + 2.0 * d * kv_width + query_width * d + 3.0 * d * ffn;
  const double matrix_parameters = static_cast<double>(config.num_layers) * per_layer + vocab * d;
  double positions = 0;
  double pairs = 0;  // unmasked (t, s): s in [attention_start[t], t]
  for (const Sample& sample : samples) {
    positions += static_cast<double>(sample.tokens.size());
    for (std::size_t t = 0; t < sample.attention_start.size(); ++t) {
      pairs += static_cast<double>(static_cast<std::int64_t>(t) - sample.attention_start[t] + 1);
    }
  }
  // QK^T and PV: 2 x H*hd multiply-adds each per pair forward (4 H hd FLOPs), x3 with backward.
  const double attention = 12.0 * static_cast<double>(config.num_layers) * query_width * pairs;
  return 6.0 * matrix_parameters * positions + attention;
}

Trainer::Trainer(const RunConfig& config, SampleProvider samples, const ProductionOptions& options)
    : config_(config),
      layout_(make_model_layout(config.model)),
      samples_(std::move(samples)),
      options_(options) {
  require_single_rank(config_.parallel);
  backend_ = make_backend(options_.device);
  compute_ = config_.optimizer.bf16 ? DType::bf16 : DType::f32;  // SPEC 7
  segments_ = decay_segments(layout_);
  const std::int64_t n = layout_.total_elements;

  // SPEC 4: fp32 values, bit-identical to every engine's iteration 0.
  const std::vector<float> initial = initial_parameters(config_.model, config_.data.seed);  // [N]
  main_weights_ = Buffer<float>(*backend_, n);
  main_weights_.upload(initial);
  main_grads_ = Buffer<float>(*backend_, n);
  exp_avg_ = Buffer<float>(*backend_, n);
  exp_avg_sq_ = Buffer<float>(*backend_, n);
  if (compute_ != DType::f32) compute_weights_ = ComputeBuffer(*backend_, compute_, n);
  refresh_compute_weights();
  norm_blocks_ = Buffer<double>(*backend_, squared_norm_blocks(n, kNormBlockElements));

  DecoderOptions decoder;
  decoder.micro_batch_size = config_.batch.micro_batch_size;
  decoder.logits_chunk_rows = options_.logits_chunk_rows;
  decoder.compute = compute_;
  model_ = std::make_unique<DecoderModel>(config_.model, layout_, *backend_, decoder);
  row_losses_ = Buffer<float>(*backend_, config_.microbatches_per_replica() * model_->rows());
}

void Trainer::refresh_compute_weights() {
  if (compute_ == DType::f32) return;  // the fp32 compute weights are the main weights
  backend_->convert(ConvertParams{main_weights_.data(), compute_weights_.data(),
                                  main_weights_.size(), DType::f32, compute_});
}

const void* Trainer::compute_weights() const {
  return compute_ == DType::f32 ? static_cast<const void*>(main_weights_.data())
                                : compute_weights_.data();
}

std::vector<Sample> Trainer::microbatch_samples(std::int64_t microbatch) const {
  const std::int64_t mbs = config_.batch.micro_batch_size;
  // SPEC 2 with DP = 1: microbatch m takes consumed + m*mbs + [0, mbs).
  const std::int64_t first = counters_.consumed_samples + microbatch * mbs;
  std::vector<Sample> batch;
  batch.reserve(static_cast<std::size_t>(mbs));
  for (std::int64_t j = 0; j < mbs; ++j) batch.push_back(samples_(first + j));
  return batch;
}

HostState Trainer::host_state() const {
  HostState state;
  state.params = main_weights_.download();
  state.exp_avg = exp_avg_.download();
  state.exp_avg_sq = exp_avg_sq_.download();
  state.counters = counters_;
  return state;
}

void Trainer::restore(const HostState& state) {
  main_weights_.upload(state.params);
  exp_avg_.upload(state.exp_avg);
  exp_avg_sq_.upload(state.exp_avg_sq);
  counters_ = state.counters;
  refresh_compute_weights();
}

std::vector<AuditEntry> Trainer::audit_before_update(const IterationRecord& record) const {
  std::vector<AuditEntry> entries;
  std::size_t tensor = 0;
  for (const std::int64_t flat : audit_elements_) {
    while (layout_.tensors[tensor].offset + layout_.tensors[tensor].numel <= flat) ++tensor;
    const ParameterTensor& owner = layout_.tensors[tensor];
    AuditEntry entry;
    entry.tensor = owner.name;
    entry.element = flat - owner.offset;
    entry.group = to_string(owner.decay_group);
    // The fp32 values, widened exactly (SPEC 12: tandem audit reads "main_precision":"fp32").
    entry.old_value = main_weights_.download(flat, 1).front();
    entry.grad = main_grads_.download(flat, 1).front();
    entry.old_m = exp_avg_.download(flat, 1).front();
    entry.old_v = exp_avg_sq_.download(flat, 1).front();
    entry.lr = record.lr;
    entry.wd = owner.decay_group == DecayGroup::decay ? record.wd : 0.0;
    entries.push_back(entry);
  }
  return entries;
}

void Trainer::audit_after_update(std::vector<AuditEntry>& entries) const {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::int64_t flat = audit_elements_[i];
    entries[i].m = exp_avg_.download(flat, 1).front();
    entries[i].v = exp_avg_sq_.download(flat, 1).front();
    entries[i].new_value = main_weights_.download(flat, 1).front();
    entries[i].step = counters_.successful_updates;
  }
}

IterationRecord Trainer::run_iteration() {
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t gbs = config_.batch.global_batch_size;
  const std::int64_t microbatches = config_.microbatches_per_replica();
  const std::int64_t rows = model_->rows();  // positions per microbatch
  const bool per_token = config_.data.loss_normalization == LossNormalization::per_token;
  IterationRecord record;
  record.iteration = counters_.iteration + 1;

  // 1. The global batch, and its loss tokens (SPEC 5: the per-token denominator).
  std::vector<std::vector<Sample>> batch(static_cast<std::size_t>(microbatches));
  std::int64_t global_loss_tokens = 0;
  for (std::int64_t m = 0; m < microbatches; ++m) {
    batch[static_cast<std::size_t>(m)] = microbatch_samples(m);
    for (const Sample& sample : batch[static_cast<std::size_t>(m)]) {
      record.input_tokens += sample.input_tokens;
      record.loss_tokens += sample.loss_tokens;
      record.pad_tokens += sample.pad_tokens;
      global_loss_tokens += sample.loss_tokens;
    }
  }

  // 2. Forward/backward of every microbatch, fp32 main gradients accumulated across them.
  // SPEC 5 scales as the reference: 1/(global loss tokens) per-token; microbatch-mean
  // 1/(microbatch loss tokens x microbatches); 0 without loss tokens. Rounded to fp32 once.
  main_grads_.zero();
  for (std::int64_t m = 0; m < microbatches; ++m) {
    const auto& samples = batch[static_cast<std::size_t>(m)];
    std::int64_t microbatch_loss_tokens = 0;
    for (const Sample& sample : samples) microbatch_loss_tokens += sample.loss_tokens;
    double loss_scale = 0.0;
    if (per_token && global_loss_tokens > 0) {
      loss_scale = 1.0 / static_cast<double>(global_loss_tokens);
    } else if (!per_token && microbatch_loss_tokens > 0) {
      loss_scale = 1.0 / (static_cast<double>(microbatch_loss_tokens) * static_cast<double>(microbatches));
    }
    model_->forward_backward(samples, compute_weights(), static_cast<float>(loss_scale),
                             main_grads_.data(), row_losses_.at(m * rows));
  }

  // 3. Data-parallel reduction of main_grads_ (sum over replicas): the identity on one rank.
  // The multi-rank trainer all-reduces (or reduce-scatters, with the distributed optimizer) here.
  if (options_.switches.nonfinite_gradient_iterations.count(record.iteration) != 0) {
    const float not_a_number = std::nanf("");
    backend_->copy_from_host(main_grads_.data(), &not_a_number, sizeof(float));
  }
  if (keep_last_gradient_) last_gradient_ = main_grads_.download();

  // SPEC 5: the logged loss is the global token-weighted mean; rows summed in double, in order.
  const std::vector<float> row_losses = row_losses_.download();  // [microbatches * rows]
  double loss_sum = 0.0;
  for (const float loss : row_losses) loss_sum += static_cast<double>(loss);
  last_loss_sum_ = loss_sum;
  const double loss = global_loss_tokens > 0 ? loss_sum / static_cast<double>(global_loss_tokens) : 0.0;
  record.loss = loss;

  // 4. SPEC 6: norm from fixed-order partial sums over the flat buffer (each element once).
  backend_->squared_norm(SquaredNormParams{main_grads_.data(), norm_blocks_.data(),
                                           main_grads_.size(), kNormBlockElements});
  double sum_of_squares = 0.0;
  for (const double block : norm_blocks_.download()) sum_of_squares += block;
  // (DP > 1: the partial sums of the ranks' shards are all-reduced here.)
  const double grad_norm = std::sqrt(sum_of_squares);
  record.grad_norm = grad_norm;

  // The scheduler holds n = successful updates x GBS (SPEC 8).
  const double lr = learning_rate<double>(config_.schedule, counters_.scheduler_samples);
  const double wd = weight_decay_at<double>(config_.schedule, counters_.scheduler_samples);
  record.lr = lr;
  record.wd = wd;

  // 5. SPEC 8: a non-finite norm or loss skips the update; nothing but counters changes.
  const bool finite = std::isfinite(grad_norm) && std::isfinite(loss);
  if (finite) {
    // 6. SPEC 6: coeff = clip / (norm + 1e-6), applied when below 1.
    double clip_coeff = 1.0;
    if (config_.optimizer.clip_grad > 0.0) {
      const double coeff = config_.optimizer.clip_grad / (grad_norm + kClipNormEpsilon);
      if (coeff < 1.0) {
        clip_coeff = coeff;
        record.clipped = true;
        backend_->scale(ScaleParams{main_grads_.data(), main_grads_.size(), static_cast<float>(coeff)});
      }
    }
    record.clip_coeff = clip_coeff;

    // 7. SPEC 7: fused AdamW over the flat range, then the bf16 compute copy.
    const std::int64_t step = counters_.successful_updates + 1;
    std::vector<AuditEntry> audit = audit_before_update(record);
    AdamwParams adamw;
    adamw.params = main_weights_.data();
    adamw.exp_avg = exp_avg_.data();
    adamw.exp_avg_sq = exp_avg_sq_.data();
    adamw.grads = main_grads_.data();
    adamw.compute_weights = compute_ == DType::f32 ? nullptr : compute_weights_.data();
    adamw.compute_dtype = compute_;
    adamw.count = main_weights_.size();
    adamw.segments = segments_.data();
    adamw.segment_count = static_cast<std::int64_t>(segments_.size());
    adamw.hyper = adamw_hyper(config_.optimizer, step, lr, wd);
    backend_->adamw(adamw);

    // 8. Schedule and counters of a successful update.
    counters_.successful_updates = step;
    counters_.scheduler_samples += gbs;
    counters_.consecutive_skips = 0;
    audit_after_update(audit);
    record.audit = std::move(audit);
  } else {
    record.update_successful = false;
    record.clip_coeff = 1.0;
    counters_.skipped_updates += 1;
    counters_.consecutive_skips += 1;
  }
  // SPEC 1/8: iteration and consumed samples advance either way; the batch was read.
  counters_.iteration += 1;
  counters_.consumed_samples += gbs;
  counters_.input_tokens += record.input_tokens;
  counters_.loss_tokens += record.loss_tokens;
  counters_.pad_tokens += record.pad_tokens;

  record.step = counters_.successful_updates;
  record.consumed_samples = counters_.consumed_samples;
  record.totals = counters_;
  backend_->synchronize();
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  record.tokens_per_second =
      record.seconds > 0 ? static_cast<double>(record.input_tokens) / record.seconds : 0.0;
  double flops = 0.0;
  for (const auto& microbatch : batch) flops += model_flops(config_.model, microbatch);
  record.model_flops = flops;
  const double peak = backend_->peak_flops_per_second(compute_);
  if (peak > 0 && record.seconds > 0) record.mfu = *record.model_flops / record.seconds / peak;
  return record;
}

}  // namespace tandem::production
