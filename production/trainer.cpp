// The production trainer's iteration (trainer.hpp): its construction, the step, evaluation and the
// global batch's samples, counts and losses. Its pipeline passes are in trainer_pipeline.cpp, its
// gradient sums over tensor parallelism and the tied embedding in trainer_gradients.cpp, its
// whole-model state (gathers, checkpoint pieces, restore) in trainer_state.cpp.
#include "production/trainer.hpp"

#include <chrono>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "core/init.hpp"
#include "core/schedule.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

// Context parallelism is not built yet; data, tensor and pipeline parallelism are, with as many
// ranks in each group as the configuration says.
void require_layout(const ParallelConfig& parallel, int replicas, int tensor_ranks, int stages) {
  if (parallel.context_parallel != 1) {
    throw std::invalid_argument("production trainer: --context-parallel-size = " +
                                std::to_string(parallel.context_parallel) +
                                ", but this trainer runs data, tensor and pipeline parallelism only (CP is not built "
                                "yet); fix: set it to 1");
  }
  const std::int64_t world = parallel.data_parallel * parallel.tensor_parallel * parallel.pipeline_parallel;
  if (parallel.data_parallel != replicas || parallel.tensor_parallel != tensor_ranks ||
      parallel.pipeline_parallel != stages) {
    throw std::invalid_argument(
        "production trainer: --data-parallel-size " + std::to_string(parallel.data_parallel) +
        " x --tensor-model-parallel-size " + std::to_string(parallel.tensor_parallel) +
        " x --pipeline-model-parallel-size " + std::to_string(parallel.pipeline_parallel) + " = " +
        std::to_string(world) + " ranks, but this rank's groups hold " + std::to_string(replicas) + " x " +
        std::to_string(tensor_ranks) + " x " + std::to_string(stages) + " (one rank per process); fix: launch " +
        std::to_string(world) + " ranks (mpirun -np " + std::to_string(world) +
        " or srun), or drop --data-parallel-size (--engine reference emulates DP in one process)");
  }
}

// SPEC 4's fp32 initial values as this build's Real (exact; a copy only in the semantic build).
std::vector<Real> as_real(std::vector<float> values) {
#if defined(TANDEM_PRODUCTION_SEMANTIC)
  return std::vector<Real>(values.begin(), values.end());
#else
  return values;
#endif
}

// SPEC 7's hyperparameters for step t in double, rounded to Real once.
AdamwHyper adamw_hyper(const OptimizerConfig& optimizer, std::int64_t step, double lr, double wd,
                       const StepHooks& hooks) {
  double beta1_power = 1.0;  // b^t by repeated multiplication, as the reference
  double beta2_power = 1.0;
  for (std::int64_t i = 0; i < step; ++i) {
    beta1_power *= optimizer.adam_beta1;
    beta2_power *= optimizer.adam_beta2;
  }
  AdamwHyper hyper;
  hyper.lr = static_cast<Real>(lr);
  hyper.weight_decay = static_cast<Real>(wd);
  hyper.beta1 = static_cast<Real>(optimizer.adam_beta1);
  hyper.beta2 = static_cast<Real>(optimizer.adam_beta2);
  hyper.one_minus_beta1 = static_cast<Real>(1.0 - optimizer.adam_beta1);
  hyper.one_minus_beta2 = static_cast<Real>(1.0 - optimizer.adam_beta2);
  hyper.eps = static_cast<Real>(hooks.adam_epsilon(optimizer.adam_eps, 1.0 - beta2_power));  // StepHooks point
  hyper.bias_correction1 = static_cast<Real>(1.0 - beta1_power);
  hyper.bias_correction2 = static_cast<Real>(1.0 - beta2_power);
  return hyper;
}

// The loss tokens of one microbatch's samples (SPEC 5).
std::int64_t microbatch_loss_tokens(const std::vector<Sample>& samples) {
  std::int64_t tokens = 0;
  for (const Sample& sample : samples) tokens += sample.loss_tokens;
  return tokens;
}

// A layout passed in (ProductionOptions::layout) is shared by every rank of a process: one made for
// another configuration would silently give this rank the wrong layers or groups.
void require_same_layout(const RunLayout& layout, const RunConfig& config) {
  const ParallelConfig& parallel = config.parallel;
  const RankGrid& grid = layout.grid;
  if (grid.tensor_size() != parallel.tensor_parallel || grid.context_size() != parallel.context_parallel ||
      grid.data_size() != parallel.data_parallel || grid.pipeline_size() != parallel.pipeline_parallel ||
      !(layout.stages.split() == pipeline_split(config.model, parallel))) {
    throw std::invalid_argument("production trainer: the layout passed in (" + grid.describe() +
                                ") is not the configuration's; fix: derive it from this configuration (RunLayout)");
  }
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
    : config_(config), layout_(split_.local()), samples_(std::move(samples)), options_(options) {
  static const StepHooks kIdentity;
  hooks_ = options_.hooks ? options_.hooks : std::shared_ptr<const StepHooks>(std::shared_ptr<const StepHooks>{}, &kIdentity);
  backend_ = make_backend(options_.device, options_.device_index, options_.host_kernels, options_.cpu_threads);
  collectives_ = options_.collectives ? options_.collectives(*backend_) : single_rank_collectives();
  tp_group_ = options_.tensor_parallel ? options_.tensor_parallel(*backend_) : single_rank_collectives();
  world_ = options_.world ? options_.world(*backend_) : collectives_;
  pipeline_group_ = options_.pipeline ? options_.pipeline(*backend_) : single_rank_collectives();
  if (options_.embedding) embedding_group_ = options_.embedding(*backend_);  // null on a middle stage
  require_layout(config_.parallel, collectives_->size(), tp_group_->size(), pipeline_group_->size());
  if (world_->size() != collectives_->size() * tp_group_->size() * pipeline_group_->size()) {
    throw std::invalid_argument("production trainer: " + std::to_string(world_->size()) + " ranks in all for " +
                                std::to_string(collectives_->size()) + " data-parallel x " +
                                std::to_string(tp_group_->size()) + " tensor-parallel x " +
                                std::to_string(pipeline_group_->size()) + " pipeline ranks");
  }
  run_layout_ = options_.layout ? options_.layout : std::make_shared<const RunLayout>(config_);
  require_same_layout(*run_layout_, config_);
  stages_ = &run_layout_->stages;
  split_ = TensorParallelLayout(config_.model, tp_group_->size(), tp_group_->rank(), *stages_, pipeline_group_->rank());
  const std::vector<FlatRange> tied = split_.tied_embedding_ranges();
  if (!tied.empty() && (!embedding_group_ || embedding_group_->size() != 2)) {
    throw std::invalid_argument("production trainer: pipeline stage " + std::to_string(split_.pipeline_stage()) +
                                " holds a tied embedding but no embedding group of its first and last stage");
  }
  compute_ = config_.optimizer.bf16 ? DType::bf16 : DType::f32;  // SPEC 7
  if (kSemanticBuild && compute_ == DType::bf16) {
    throw std::invalid_argument("production trainer (the semantic build, Real = double): --bf16 is refused, "
                                "its compute stores would round through fp32; fix: run it without --bf16");
  }

  ExchangeOptions exchange;
  exchange.distributed_optimizer = config_.parallel.use_distributed_optimizer;
  exchange.overlap_grad_reduce = config_.parallel.overlap_grad_reduce;
  exchange.overlap_param_gather = config_.parallel.overlap_param_gather;
  exchange.bucket_parameters = gradient_bucket_parameters(config_.parallel);
  // The tied embedding's two copies begin both stages' buffers: the same buckets and slices.
  exchange.leading_elements = tied.empty() ? 0 : tied.front().begin + tied.front().count;
  exchange_ = GradientExchange(*backend_, collectives_, layout_.total_elements, exchange, options_.hooks);

  // SPEC 4: fp32 values, bit-identical to every engine's iteration 0 and to every layout's (each
  // element the full tensor's value at its index); each rank keeps its pieces.
  const std::vector<Real> initial = split_.size() == 1 && split_.pipeline_size() == 1
                                        ? as_real(initial_parameters(config_.model, config_.data.seed))
                                        : split_.initial_parameters(config_.model, config_.data.seed);
  state_ = MainStateShard(*backend_, exchange_.kept_ranges(), decay_segments(layout_), initial);
  if (compute_ != DType::f32 || exchange_.distributed()) {
    compute_weights_ = ComputeBuffer(*backend_, compute_, exchange_.shards().padded());
  }
  publish_compute_weights(GradientExchange::WeightGather::now);
  audit_ = std::make_unique<UpdateAudit>(split_, state_, exchange_, *world_);

  DecoderOptions decoder;
  decoder.micro_batch_size = config_.batch.micro_batch_size;
  decoder.logits_chunk_rows = options_.logits_chunk_rows;
  decoder.compute = compute_;
  decoder.recompute = config_.recompute;
  if (split_.size() > 1) {
    tp_comm_ = TensorParallelComm(*backend_, tp_group_, decoder.micro_batch_size * config_.model.seq_length *
                                                            config_.model.hidden_size);
    decoder.tensor_parallel = &split_;
    decoder.tensor_parallel_comm = &tp_comm_;
    decoder.sequence_parallel = config_.parallel.sequence_parallel;
    decoder.hooks = hooks_.get();
  }
  if (split_.pipeline_size() > 1) {
    decoder.pipeline = stages_;
    decoder.pipeline_stage = split_.pipeline_stage();
    decoder.activation_slots = microbatches_in_flight(training_passes());
    decoder.chunk_slots = chunk_activation_slots(training_passes()).count;
  }
  if (!tied.empty()) embedding_comm_ = TensorParallelComm(*backend_, embedding_group_, tied.front().count);
  model_ = std::make_unique<DecoderModel>(config_.model, layout_, *backend_, decoder);
  row_losses_ = Buffer<Real>(*backend_, config_.microbatches_per_replica() * model_->rows());
  if (split_.pipeline_size() > 1) {  // an exchange moves at most two messages each way (an interleaved step)
    outgoing_ = Buffer<std::uint8_t>(*backend_, 2 * model_->stream_bytes());
    incoming_ = Buffer<std::uint8_t>(*backend_, 2 * model_->stream_bytes());
  }
}

// The compute weights from this rank's main state: converted (bf16) or copied (fp32 with the
// distributed optimizer) into the compute buffer at the pieces' places, then all-gathered from the
// slices' owners when the state is sharded. fp32 with a whole state: the main weights serve.
void Trainer::publish_compute_weights(GradientExchange::WeightGather when) {
  if (compute_weights_.size() == 0) return;
  for (const MainStateShard::Piece& piece : state_.pieces()) {
    backend_->convert(ConvertParams{state_.weights().at(piece.local), compute_weights_.at(piece.begin),
                                    piece.count, DType::f32, compute_});
  }
  exchange_.publish_weights(compute_weights_, when);
}

const void* Trainer::compute_weights() const {
  return compute_weights_.size() == 0 ? static_cast<const void*>(state_.weights().data())
                                      : compute_weights_.data();
}

std::vector<Sample> Trainer::microbatch_samples(const SampleProvider& source, std::int64_t consumed,
                                                std::int64_t microbatch) const {
  const std::int64_t mbs = config_.batch.micro_batch_size;
  const std::int64_t ranks = collectives_->size();
  // SPEC 2: microbatch m on DP rank r takes consumed + m*mbs*DP + r*mbs + [0, mbs).
  const std::int64_t first = consumed + microbatch * mbs * ranks + collectives_->rank() * mbs;
  std::vector<Sample> batch;
  batch.reserve(static_cast<std::size_t>(mbs));
  for (std::int64_t j = 0; j < mbs; ++j) batch.push_back(source(first + j));
  return batch;
}

double Trainer::global_loss_sum(double partial) const {
  // Pipeline parallelism: the last stage computes the losses (its whole data-parallel group does
  // this sum); every stage takes its value.
  const bool last_stage = split_.pipeline_stage() == split_.pipeline_size() - 1;
  const double loss_sum = last_stage ? replicas_loss_sum(partial) : 0.0;
  if (split_.pipeline_size() == 1) return loss_sum;
  return all_gather_values(*pipeline_group_, std::span(&loss_sum, 1)).back();
}

double Trainer::replicas_loss_sum(double partial) const {
  // SPEC 5: each microbatch's rows summed in double, in order, then the microbatches in global
  // order (m, then rank), whatever the DP size, added to `partial` one by one.
  const std::int64_t microbatches = config_.microbatches_per_replica();
  const std::int64_t ranks = collectives_->size();
  const std::int64_t rows = model_->rows();
  const std::vector<Real> row_losses = row_losses_.download();  // [microbatches * rows]
  std::vector<double> microbatch_losses(static_cast<std::size_t>(microbatches), 0.0);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    for (std::int64_t row = 0; row < rows; ++row) {
      microbatch_losses[static_cast<std::size_t>(m)] += static_cast<double>(row_losses[static_cast<std::size_t>(m * rows + row)]);
    }
  }
  const std::vector<double> all_losses = all_gather_values(*collectives_, microbatch_losses);  // [DP, M]
  double loss_sum = partial;
  for (std::int64_t m = 0; m < microbatches; ++m) {
    for (std::int64_t r = 0; r < ranks; ++r) loss_sum += all_losses[static_cast<std::size_t>(r * microbatches + m)];
  }
  return loss_sum;
}

EvaluationRecord Trainer::evaluate(const SampleProvider& validation, std::int64_t batches) {
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t gbs = config_.batch.global_batch_size;
  const std::int64_t microbatches = config_.microbatches_per_replica();
  const std::int64_t rows = model_->rows();
  exchange_.finish_deferred_gathers(compute_weights_);  // --overlap-param-gather deferred them
  EvaluationRecord record;
  record.iteration = counters_.iteration;
  // One running sum over every batch's microbatches in order (batch, m, rank), as the reference
  // sums, and as training sums one global batch that held all of them.
  double loss_sum = 0.0;
  for (std::int64_t batch = 0; batch < batches; ++batch) {
    double local_loss_tokens = 0.0;  // integers far below 2^53: exact
    std::vector<std::vector<Sample>> samples(static_cast<std::size_t>(microbatches));
    for (std::int64_t m = 0; m < microbatches; ++m) {
      samples[static_cast<std::size_t>(m)] = microbatch_samples(validation, counters_.consumed_valid_samples, m);
      for (const Sample& sample : samples[static_cast<std::size_t>(m)]) {
        local_loss_tokens += static_cast<double>(sample.loss_tokens);
      }
    }
    // Forward only, one microbatch at a time through the stages; the last stage's loss alone.
    run_passes(one_microbatch_at_a_time(stages_->virtual_stages(), microbatches, true),
               [&](const PipelinePass& pass, std::int64_t slot, std::int64_t chunk_slot) {
                 if (pass.chunk == 0) model_->begin_microbatch(samples[static_cast<std::size_t>(pass.microbatch)], slot);
                 model_->forward_chunk(compute_weights(), slot, pass.chunk, chunk_slot);
                 if (model_->ends_model(pass.chunk)) model_->chunk_loss(compute_weights(), slot, row_losses_.at(pass.microbatch * rows));
               });
    loss_sum = global_loss_sum(loss_sum);
    for (const double tokens : all_gather_values(*collectives_, std::span(&local_loss_tokens, 1))) {
      record.loss_tokens += static_cast<std::int64_t>(tokens);
    }
    counters_.consumed_valid_samples += gbs;  // Megatron: per evaluation batch
    record.samples += gbs;
  }
  record.loss = record.loss_tokens > 0 ? loss_sum / static_cast<double>(record.loss_tokens) : 0.0;
  record.ppl = evaluation_perplexity(record.loss);
  record.consumed_valid_samples = counters_.consumed_valid_samples;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return record;
}

// SPEC 2: this rank's microbatches. SPEC 5: the global batch's token counts (the per-token
// denominator is the whole global batch's) and model FLOPs, gathered from every rank.
Trainer::GlobalBatch Trainer::read_global_batch(std::int64_t consumed) const {
  const std::int64_t microbatches = config_.microbatches_per_replica();
  const std::int64_t ranks = collectives_->size();
  GlobalBatch batch;
  batch.microbatches.resize(static_cast<std::size_t>(microbatches));
  // What each rank contributes, in these slots (token counts are integers far below 2^53: exact).
  enum Slot : std::size_t { kInputTokens, kLossTokens, kPadTokens, kModelFlops, kSlots };
  std::vector<double> local_counts(kSlots, 0.0);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    auto& samples = batch.microbatches[static_cast<std::size_t>(m)];
    samples = microbatch_samples(samples_, consumed, m);
    for (const Sample& sample : samples) {
      local_counts[kInputTokens] += static_cast<double>(sample.input_tokens);
      local_counts[kLossTokens] += static_cast<double>(sample.loss_tokens);
      local_counts[kPadTokens] += static_cast<double>(sample.pad_tokens);
    }
    local_counts[kModelFlops] += model_flops(config_.model, samples);
  }
  const std::vector<double> counts = all_gather_values(*collectives_, local_counts);  // [DP, kSlots]
  for (std::int64_t r = 0; r < ranks; ++r) {
    const double* rank_counts = counts.data() + r * kSlots;
    batch.input_tokens += static_cast<std::int64_t>(rank_counts[kInputTokens]);
    batch.loss_tokens += static_cast<std::int64_t>(rank_counts[kLossTokens]);
    batch.pad_tokens += static_cast<std::int64_t>(rank_counts[kPadTokens]);
    batch.model_flops += rank_counts[kModelFlops];
  }
  batch.rank_loss_tokens = static_cast<std::int64_t>(local_counts[kLossTokens]);
  return batch;
}

// SPEC 5 scales as the reference: 1/(global loss tokens) per-token; microbatch-mean
// 1/(microbatch loss tokens x microbatches x DP); 0 without loss tokens. Rounded to fp32 once.
std::vector<Real> Trainer::loss_scales(const GlobalBatch& batch) const {
  const bool per_token = config_.data.loss_normalization == LossNormalization::per_token;
  const auto replicas = static_cast<double>(config_.microbatches_per_replica() * collectives_->size());
  const std::int64_t denominator = hooks().loss_denominator(batch.loss_tokens, batch.rank_loss_tokens);  // StepHooks point
  std::vector<Real> scales;
  for (const auto& samples : batch.microbatches) {
    const std::int64_t tokens = microbatch_loss_tokens(samples);
    double loss_scale = 0.0;
    if (per_token && denominator > 0) {
      loss_scale = 1.0 / static_cast<double>(denominator);
    } else if (!per_token && tokens > 0) {
      loss_scale = 1.0 / (static_cast<double>(tokens) * replicas);
    }
    scales.push_back(static_cast<Real>(loss_scale));
  }
  return scales;
}

// SPEC 5: forward/backward of every microbatch, the fp32 main gradients accumulated across them;
// SPEC 1: the reduction over replicas (DP > 1), overlapped with the last microbatch's backward or
// after it (gradient_exchange.hpp).
void Trainer::forward_backward_and_reduce(const GlobalBatch& batch) {
  const std::vector<Real> scales = loss_scales(batch);
  const std::int64_t rows = model_->rows();
  // The hooks capture the exchange's step state: the model drops them however the call ends.
  struct DropHooks {
    DecoderModel& model;
    ~DropHooks() { model.set_hooks({}); }
  } drop_hooks{*model_};
  exchange_.begin_forward_backward(compute_weights_);
  const std::size_t microbatches = batch.microbatches.size();
  // One stage: each microbatch's forward, then its backward. Pipeline stages: the schedule's
  // passes (1F1B), which add each stage's microbatches in the same order. The weight gathers are
  // waited for in microbatch 0's forward, the buckets reduced in microbatch M-1's backward.
  const bool timed = options_.pipeline_timeline && split_.pipeline_size() > 1;
  const bool last_stage = split_.pipeline_stage() + 1 == split_.pipeline_size();
  std::vector<TimedPass> timings;
  if (timed) {  // a common start: every stage leaves the barrier together
    backend_->synchronize();
    pipeline_group_->barrier();
    timing_start_ = std::chrono::steady_clock::now();
  }
  run_passes(training_passes(), [&](const PipelinePass& pass, std::int64_t slot, std::int64_t chunk_slot) {
    const auto m = static_cast<std::size_t>(pass.microbatch);
    ModelHooks hooks = exchange_.model_hooks(m, microbatches);
    (pass.forward ? hooks.gradients_done : hooks.before_weights) = nullptr;
    model_->set_hooks(std::move(hooks));
    if (pass.forward) {
      if (pass.chunk == 0) {
        const std::size_t begun =
            last_stage ? m : static_cast<std::size_t>(this->hooks().sent_microbatch(pass.microbatch, static_cast<std::int64_t>(microbatches)));  // StepHooks point
        model_->begin_microbatch(batch.microbatches[begun], slot);
      }
      model_->forward_chunk(compute_weights(), slot, pass.chunk, chunk_slot);
    } else {
      const Real scale = last_stage ? this->hooks().last_stage_loss_scale(scales[m], microbatch_loss_tokens(batch.microbatches[m]))  // StepHooks point
                                     : scales[m];
      model_->backward_chunk(compute_weights(), slot, pass.chunk, chunk_slot, scale, exchange_.main_grads().data(),
                             row_losses_.at(pass.microbatch * rows));
      const bool between_microbatches = pass.chunk == 0 && m + 1 < microbatches;
      if (between_microbatches && this->hooks().rounds_main_gradients_to_bf16_between_microbatches()) {
        round_main_gradients_to_bf16();  // StepHooks point
      }
    }
  }, timed ? &timings : nullptr);
  last_timeline_.reset();
  if (timed) last_timeline_ = gather_timeline(counters_.iteration + 1, timings);
  exchange_.finish_reduction();
  sum_replicated_gradients_over_tp();
  sum_tied_embedding_gradients();
}

void Trainer::round_main_gradients_to_bf16() {
  Buffer<Real>& main_grads = exchange_.main_grads();  // [local N] fp32
  Buffer<Bf16> rounded(*backend_, main_grads.size());   // [local N] bf16
  backend_->convert(ConvertParams{main_grads.data(), rounded.data(), main_grads.size(), DType::f32, DType::bf16});
  backend_->convert(ConvertParams{rounded.data(), main_grads.data(), main_grads.size(), DType::bf16, DType::f32});
}

// SPEC 5: the logged loss is the global token-weighted mean (0 without loss tokens).
double Trainer::global_loss(const GlobalBatch& batch, std::int64_t iteration) {
  last_loss_sum_ = global_loss_sum(0.0);
  const double loss = batch.loss_tokens > 0 ? last_loss_sum_ / static_cast<double>(batch.loss_tokens) : 0.0;
  return hooks().loss(iteration, loss);  // StepHooks point
}

// SPEC 6: coeff = clip / (norm + 1e-6), applied to this rank's gradients when below 1. Returns the
// coefficient applied (1 when not clipped).
double Trainer::clip(const GradientNorm& norm, IterationRecord& record) {
  if (config_.optimizer.clip_grad <= 0.0) return 1.0;
  const double clip_norm = hooks().clip_norm(norm.global(), norm.own_slices());  // StepHooks point
  const double coeff = config_.optimizer.clip_grad / (clip_norm + kClipNormEpsilon);
  if (coeff >= 1.0) return 1.0;
  record.clipped = true;
  for (const MainStateShard::Piece& piece : state_.pieces()) {
    backend_->scale(ScaleParams{exchange_.main_grads().at(piece.begin), piece.count, static_cast<Real>(coeff)});
  }
  return coeff;
}

// SPEC 7: fused AdamW over each piece of this rank's state (step t = successful updates including
// this one), then the compute copy and, with the distributed optimizer, its gathers.
void Trainer::adamw(std::int64_t step, double lr, double wd) {
  for (const MainStateShard::Piece& piece : state_.pieces()) {
    AdamwParams adamw;
    adamw.params = state_.weights().at(piece.local);
    adamw.exp_avg = state_.exp_avg().at(piece.local);
    adamw.exp_avg_sq = state_.exp_avg_sq().at(piece.local);
    adamw.grads = exchange_.main_grads().at(piece.begin);
    adamw.compute_weights = compute_ == DType::f32 ? nullptr : compute_weights_.at(piece.begin);
    adamw.compute_dtype = compute_;
    adamw.count = piece.count;
    adamw.segments = piece.segments.data();
    adamw.segment_count = static_cast<std::int64_t>(piece.segments.size());
    adamw.hyper = adamw_hyper(config_.optimizer, step, lr, wd, hooks());
    backend_->adamw(adamw);
  }
  if (exchange_.distributed()) {
    // fp32 compute: the slices' new weights into the compute copy. Then every rank's slices:
    // now, or bucket by bucket in the next forward (--overlap-param-gather).
    if (compute_ == DType::f32) {
      for (const MainStateShard::Piece& piece : state_.pieces()) {
        backend_->copy(compute_weights_.at(piece.begin), state_.weights().at(piece.local),
                       piece.count * static_cast<std::int64_t>(sizeof(Real)));
      }
    }
    exchange_.publish_weights(compute_weights_, GradientExchange::WeightGather::step);
  }
}

// SPEC 8: the counters of a successful or skipped update; SPEC 1/8: iteration and consumed
// samples advance either way (the batch was read).
void Trainer::count_update(IterationRecord& record, bool successful) {
  const std::int64_t gbs = config_.batch.global_batch_size;
  if (successful) {
    counters_.successful_updates += 1;
    counters_.scheduler_samples += gbs;
    counters_.consecutive_skips = 0;
  } else {
    record.update_successful = false;
    record.clip_coeff = 1.0;
    counters_.skipped_updates += 1;
    counters_.consecutive_skips += 1;
  }
  counters_.iteration += 1;
  counters_.consumed_samples += gbs;
  counters_.input_tokens += record.input_tokens;
  counters_.loss_tokens += record.loss_tokens;
  counters_.pad_tokens += record.pad_tokens;
  record.step = counters_.successful_updates;
  record.consumed_samples = counters_.consumed_samples;
  record.totals = counters_;
}

IterationRecord Trainer::run_iteration() {
  const auto started = std::chrono::steady_clock::now();
  IterationRecord record;
  record.iteration = counters_.iteration + 1;

  const GlobalBatch batch = read_global_batch(counters_.consumed_samples);  // SPEC 2, 5
  record.input_tokens = batch.input_tokens;
  record.loss_tokens = batch.loss_tokens;
  record.pad_tokens = batch.pad_tokens;
  forward_backward_and_reduce(batch);                                        // SPEC 5, 1
  hooks().after_reduction(record.iteration, ReducedGradient{[this](std::int64_t full, Real value) {
    const std::int64_t flat = split_.local_index(full);
    if (flat >= 0 && state_.local_offset(flat) >= 0) {
      backend_->copy_from_host(exchange_.main_grads().at(flat), &value, sizeof(Real));
    }
  }});                                                                       // StepHooks point
  if (keep_last_gradient_) last_gradient_ = gather_whole_model(exchange_.gathered_gradients());
  record.loss = global_loss(batch, record.iteration);                        // SPEC 5
  const GradientNorm norm = gradient_norm(hooks().wants_own_slices_norm());  // SPEC 6
  record.grad_norm = norm.global();
  // SPEC 8: the scheduler holds n = successful updates x GBS.
  const double lr = learning_rate<double>(config_.schedule, counters_.scheduler_samples);
  const double wd = weight_decay_at<double>(config_.schedule, counters_.scheduler_samples);
  record.lr = lr;
  record.wd = wd;

  const bool finite = std::isfinite(record.grad_norm) && std::isfinite(record.loss);  // SPEC 8
  if (finite) {
    record.clip_coeff = clip(norm, record);                                  // SPEC 6
    const std::int64_t step = counters_.successful_updates + 1;
    std::vector<AuditEntry> audit = audit_->before_update(record);
    adamw(step, lr, wd);                                                     // SPEC 7
    audit_->after_update(audit, step);
    record.audit = std::move(audit);
  }
  count_update(record, finite);                                              // SPEC 8

  backend_->synchronize();
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  record.tokens_per_second =
      record.seconds > 0 ? static_cast<double>(record.input_tokens) / record.seconds : 0.0;
  record.model_flops = batch.model_flops;
  // MFU over every rank's device: the global batch's FLOPs / (seconds x ranks x peak).
  const double peak = backend_->peak_flops_per_second(compute_);
  if (peak > 0 && record.seconds > 0) {
    record.mfu = batch.model_flops / record.seconds / (peak * static_cast<double>(world_->size()));
  }
  return record;
}

}  // namespace tandem::production
