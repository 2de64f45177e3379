// The production trainer's iteration (trainer.hpp).
#include "production/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "core/init.hpp"
#include "core/schedule.hpp"

namespace tandem::production {
namespace {

// SPEC 6: coeff = clip_grad / (norm + 1e-6).
constexpr double kClipNormEpsilon = 1e-6;

// Tensor, pipeline and context parallelism are not built yet; data parallelism is.
void require_data_parallel_only(const ParallelConfig& parallel, int ranks) {
  const auto refuse = [](const char* name, std::int64_t value) {
    throw std::invalid_argument(std::string("production trainer: ") + name + " = " +
                                std::to_string(value) +
                                ", but this trainer runs data parallelism only (TP, PP and CP are "
                                "not built yet); fix: set it to 1");
  };
  if (parallel.tensor_parallel != 1) refuse("--tensor-model-parallel-size", parallel.tensor_parallel);
  if (parallel.pipeline_parallel != 1) refuse("--pipeline-model-parallel-size", parallel.pipeline_parallel);
  if (parallel.context_parallel != 1) refuse("--context-parallel-size", parallel.context_parallel);
  if (parallel.data_parallel != ranks) {
    throw std::invalid_argument(
        "production trainer: --data-parallel-size = " + std::to_string(parallel.data_parallel) +
        ", but " + std::to_string(ranks) + " rank(s) run it (one rank per process); fix: launch " +
        std::to_string(parallel.data_parallel) + " ranks (mpirun -np " +
        std::to_string(parallel.data_parallel) + " or srun) or drop --data-parallel-size "
        "(--engine reference emulates DP in one process)");
  }
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
  backend_ = make_backend(options_.device, options_.device_index);
  collectives_ = options_.collectives ? options_.collectives(*backend_) : single_rank_collectives();
  require_data_parallel_only(config_.parallel, collectives_->size());
  compute_ = config_.optimizer.bf16 ? DType::bf16 : DType::f32;  // SPEC 7
  const std::int64_t n = layout_.total_elements;
  const int ranks = collectives_->size();
  shards_ = make_flat_shards(n, ranks, kNormBlockElements);
  distributed_ = ranks > 1 && config_.parallel.use_distributed_optimizer;
  state_begin_ = distributed_ ? shards_.begin(collectives_->rank()) : 0;
  state_count_ = distributed_ ? shards_.count(collectives_->rank()) : n;
  segments_ = segments_in_range(decay_segments(layout_), state_begin_, state_count_);

  // SPEC 4: fp32 values, bit-identical to every engine's iteration 0; each rank keeps its range.
  const std::vector<float> initial = initial_parameters(config_.model, config_.data.seed);  // [N]
  main_weights_ = Buffer<float>(*backend_, state_count_);
  main_weights_.upload(std::span<const float>(initial).subspan(static_cast<std::size_t>(state_begin_),
                                                               static_cast<std::size_t>(state_count_)));
  main_grads_ = Buffer<float>(*backend_, shards_.padded());
  if (ranks > 1) received_grads_ = Buffer<float>(*backend_, shards_.shard_elements);
  exp_avg_ = Buffer<float>(*backend_, state_count_);
  exp_avg_sq_ = Buffer<float>(*backend_, state_count_);
  if (compute_ != DType::f32 || distributed_) {
    compute_weights_ = ComputeBuffer(*backend_, compute_, shards_.padded());
  }
  publish_compute_weights();
  norm_blocks_ = Buffer<double>(*backend_, shards_.shard_elements / kNormBlockElements);

  DecoderOptions decoder;
  decoder.micro_batch_size = config_.batch.micro_batch_size;
  decoder.logits_chunk_rows = options_.logits_chunk_rows;
  decoder.compute = compute_;
  model_ = std::make_unique<DecoderModel>(config_.model, layout_, *backend_, decoder);
  row_losses_ = Buffer<float>(*backend_, config_.microbatches_per_replica() * model_->rows());
}

// The compute weights from this rank's main state: converted (bf16) or copied (fp32 with the
// distributed optimizer) into the compute buffer at the state's offset, then all-gathered from
// the shards' owners when the state is sharded. fp32 with a whole state: the main weights serve.
void Trainer::publish_compute_weights() {
  if (compute_weights_.size() == 0) return;
  if (state_count_ > 0) {
    backend_->convert(ConvertParams{main_weights_.data(), compute_weights_.at(state_begin_),
                                    state_count_, DType::f32, compute_});
  }
  if (distributed_) {
    collectives_->all_gather_in_place(compute_weights_.data(),
                                      shards_.shard_elements * dtype_bytes(compute_));
  }
}

const void* Trainer::compute_weights() const {
  return compute_weights_.size() == 0 ? static_cast<const void*>(main_weights_.data())
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
  // SPEC 5: each microbatch's rows summed in double, in order, then the microbatches in global
  // order (m, then rank), whatever the DP size, added to `partial` one by one.
  const std::int64_t microbatches = config_.microbatches_per_replica();
  const std::int64_t ranks = collectives_->size();
  const std::int64_t rows = model_->rows();
  const std::vector<float> row_losses = row_losses_.download();  // [microbatches * rows]
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
  EvaluationRecord record;
  record.iteration = counters_.iteration;
  // One running sum over every batch's microbatches in order (batch, m, rank), as the reference
  // sums, and as training sums one global batch that held all of them.
  double loss_sum = 0.0;
  for (std::int64_t batch = 0; batch < batches; ++batch) {
    double local_loss_tokens = 0.0;  // integers far below 2^53: exact
    for (std::int64_t m = 0; m < microbatches; ++m) {
      const auto samples = microbatch_samples(validation, counters_.consumed_valid_samples, m);
      for (const Sample& sample : samples) local_loss_tokens += static_cast<double>(sample.loss_tokens);
      model_->forward_loss(samples, compute_weights(), row_losses_.at(m * rows));
    }
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

// SPEC 1 "reduction over replicas" as a ring reduce-scatter: in step k = 1 .. DP-1 rank r sends
// its contribution to shard (r + k) mod DP to that shard's owner and receives the contribution of
// rank (r - k) mod DP to its own shard, adding it in fp32 with the backend's add. So shard r is
// ((g_r + g_{r-1}) + g_{r-2}) + ... (the owner's own first, then the ranks before it, cyclically):
// a fixed order, so the bits do not depend on the transport, and each step moves one shard per
// rank (a ring's bandwidth) through one shard-sized receive buffer. The replicated optimizer then
// all-gathers the reduced shards.
void Trainer::reduce_gradients() {
  const int ranks = collectives_->size();
  if (ranks == 1) return;
  const int rank = collectives_->rank();
  const std::int64_t shard = shards_.shard_elements;
  float* mine = main_grads_.at(rank * shard);
  for (int step = 1; step < ranks; ++step) {
    const int to = (rank + step) % ranks;
    const int from = (rank - step + ranks) % ranks;
    collectives_->send_receive(main_grads_.at(to * shard), to, received_grads_.data(), from, shard);
    if (options_.switches.mutants.unreduced_gradients) continue;  // test-only mutant: own part only
    backend_->add(AddParams{mine, received_grads_.data(), mine, shard, DType::f32});
  }
  if (!distributed_) {
    collectives_->all_gather_in_place(main_grads_.data(), shard * static_cast<std::int64_t>(sizeof(float)));
  }
}

// The whole flat range [N] of a main-state buffer: downloaded when whole on this rank, else each
// rank's shard all-gathered through a padded scratch buffer.
std::vector<float> Trainer::gather_flat(const Buffer<float>& state_range) const {
  if (!distributed_) return state_range.download();
  Buffer<float> whole(*backend_, shards_.padded());  // [DP x S]
  if (state_count_ > 0) {
    backend_->copy(whole.at(state_begin_), state_range.data(),
                   state_count_ * static_cast<std::int64_t>(sizeof(float)));
  }
  collectives_->all_gather_in_place(whole.data(), shards_.shard_elements * static_cast<std::int64_t>(sizeof(float)));
  return whole.download(0, shards_.total);
}

HostState Trainer::host_state() const {
  HostState state;
  state.params = gather_flat(main_weights_);
  state.exp_avg = gather_flat(exp_avg_);
  state.exp_avg_sq = gather_flat(exp_avg_sq_);
  state.counters = counters_;
  return state;
}

void Trainer::restore(const HostState& state) {
  for (const auto* whole : {&state.params, &state.exp_avg, &state.exp_avg_sq}) {
    if (static_cast<std::int64_t>(whole->size()) != shards_.total) {
      throw std::invalid_argument("Trainer::restore: " + std::to_string(whole->size()) +
                                  " elements for a model of " + std::to_string(shards_.total));
    }
  }
  restore(MainStateSlice<float>{0, state.params, state.exp_avg, state.exp_avg_sq}, state.counters);
}

MainStateSlice<float> Trainer::shard_state() const {
  const int rank = collectives_->rank();
  const std::int64_t begin = shards_.begin(rank);
  const std::int64_t count = shards_.count(rank);
  const std::int64_t local = begin - state_begin_;  // 0 with the distributed optimizer
  return {begin, main_weights_.download(local, count), exp_avg_.download(local, count),
          exp_avg_sq_.download(local, count)};
}

void Trainer::restore(const MainStateSlice<float>& slice, const Counters& counters) {
  const auto size = static_cast<std::int64_t>(slice.params.size());
  if (slice.begin > state_begin_ || slice.begin + size < state_begin_ + state_count_ ||
      static_cast<std::int64_t>(slice.exp_avg.size()) != size || static_cast<std::int64_t>(slice.exp_avg_sq.size()) != size) {
    throw std::invalid_argument("Trainer::restore: the slice [" + std::to_string(slice.begin) + ", " +
                                std::to_string(slice.begin + size) + ") does not cover this rank's range [" +
                                std::to_string(state_begin_) + ", " + std::to_string(state_begin_ + state_count_) + ")");
  }
  const auto mine = [this, &slice](const std::vector<float>& values) {
    return std::span<const float>(values).subspan(static_cast<std::size_t>(state_begin_ - slice.begin),
                                                  static_cast<std::size_t>(state_count_));
  };
  main_weights_.upload(mine(slice.params));
  exp_avg_.upload(mine(slice.exp_avg));
  exp_avg_sq_.upload(mine(slice.exp_avg_sq));
  counters_ = counters;
  publish_compute_weights();
}

std::vector<MainStateSlice<float>> Trainer::shard_pieces() const {
  MainStateSlice<float> shard = shard_state();
  if (shard.params.empty()) return {};
  return {std::move(shard)};
}

std::vector<FlatRange> Trainer::state_ranges() const {
  if (state_count_ == 0) return {};
  return {{state_begin_, state_count_}};
}

void Trainer::restore(std::span<const MainStateSlice<float>> pieces, const Counters& counters) {
  const std::vector<FlatRange> ranges = state_ranges();
  bool exact = pieces.size() == ranges.size();
  for (std::size_t i = 0; exact && i < pieces.size(); ++i) {
    exact = FlatRange{pieces[i].begin, static_cast<std::int64_t>(pieces[i].params.size())} == ranges[i];
  }
  if (!exact) {
    throw std::invalid_argument("Trainer::restore: " + std::to_string(pieces.size()) +
                                " piece(s) that are not this rank's state_ranges() (" + std::to_string(ranges.size()) +
                                " range(s) from element " + std::to_string(state_begin_) +
                                "); read exactly those ranges");
  }
  // This trainer keeps one range (or none): the single-slice restoration.
  if (pieces.empty()) {
    restore(MainStateSlice<float>{state_begin_, {}, {}, {}}, counters);
  } else {
    restore(pieces.front(), counters);
  }
}

// --audit-params: the owner of each audited element (the shard's rank with the distributed
// optimizer, else rank 0, whose whole state every rank equals) reads its values with `read`; one
// gather shares them. Returns [elements, values_per_element] as the owners read them.
std::vector<double> Trainer::audited_values(std::size_t values_per_element,
                                            const AuditRead& read) const {
  const std::size_t count = audit_elements_.size() * values_per_element;
  std::vector<double> mine(count, 0.0);
  for (std::size_t i = 0; i < audit_elements_.size(); ++i) {
    const std::int64_t local = audit_elements_[i] - state_begin_;
    if (local >= 0 && local < state_count_) read(audit_elements_[i], local, mine.data() + i * values_per_element);
  }
  if (collectives_->size() == 1) return mine;
  const std::vector<double> all = all_gather_values(*collectives_, mine);  // [DP, count]
  std::vector<double> owned(count);
  for (std::size_t i = 0; i < audit_elements_.size(); ++i) {
    const auto owner = static_cast<std::size_t>(distributed_ ? shards_.owner(audit_elements_[i]) : 0);
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(owner * count + i * values_per_element),
                values_per_element, owned.begin() + static_cast<std::ptrdiff_t>(i * values_per_element));
  }
  return owned;
}

std::vector<AuditEntry> Trainer::audit_before_update(const IterationRecord& record) const {
  if (audit_elements_.empty()) return {};  // the same on every rank: no exchange to skip alone
  constexpr std::size_t kValues = 4;  // old value, gradient, old m, old v
  // The fp32 values, widened exactly (SPEC 12: tandem audit reads "main_precision":"fp32").
  const std::vector<double> values = audited_values(kValues, [this](std::int64_t flat, std::int64_t local, double* out) {
    out[0] = main_weights_.download(local, 1).front();
    out[1] = main_grads_.download(flat, 1).front();
    out[2] = exp_avg_.download(local, 1).front();
    out[3] = exp_avg_sq_.download(local, 1).front();
  });
  std::vector<AuditEntry> entries;
  std::size_t tensor = 0;
  for (std::size_t i = 0; i < audit_elements_.size(); ++i) {
    const std::int64_t flat = audit_elements_[i];
    while (layout_.tensors[tensor].offset + layout_.tensors[tensor].numel <= flat) ++tensor;
    const ParameterTensor& owner = layout_.tensors[tensor];
    const double* element = values.data() + i * kValues;
    AuditEntry entry;
    entry.tensor = owner.name;
    entry.element = flat - owner.offset;
    entry.group = to_string(owner.decay_group);
    entry.old_value = element[0];
    entry.grad = element[1];
    entry.old_m = element[2];
    entry.old_v = element[3];
    entry.lr = record.lr;
    entry.wd = owner.decay_group == DecayGroup::decay ? record.wd : 0.0;
    entries.push_back(entry);
  }
  return entries;
}

void Trainer::audit_after_update(std::vector<AuditEntry>& entries) const {
  if (audit_elements_.empty()) return;
  constexpr std::size_t kValues = 3;  // m, v, new value
  const std::vector<double> values = audited_values(kValues, [this](std::int64_t, std::int64_t local, double* out) {
    out[0] = exp_avg_.download(local, 1).front();
    out[1] = exp_avg_sq_.download(local, 1).front();
    out[2] = main_weights_.download(local, 1).front();
  });
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const double* element = values.data() + i * kValues;
    entries[i].m = element[0];
    entries[i].v = element[1];
    entries[i].new_value = element[2];
    entries[i].step = counters_.successful_updates;
  }
}

IterationRecord Trainer::run_iteration() {
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t gbs = config_.batch.global_batch_size;
  const std::int64_t microbatches = config_.microbatches_per_replica();
  const std::int64_t ranks = collectives_->size();
  const std::int64_t rows = model_->rows();  // positions per microbatch
  const bool per_token = config_.data.loss_normalization == LossNormalization::per_token;
  IterationRecord record;
  record.iteration = counters_.iteration + 1;

  // 1. This rank's microbatches; the global batch's token counts and model FLOPs (SPEC 5: the
  // per-token denominator is the whole global batch's), gathered from every rank.
  std::vector<std::vector<Sample>> batch(static_cast<std::size_t>(microbatches));
  // What each rank contributes, in these slots (token counts are integers far below 2^53: exact).
  enum Slot : std::size_t { kInputTokens, kLossTokens, kPadTokens, kModelFlops, kSlots };
  std::vector<double> local_counts(kSlots, 0.0);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    batch[static_cast<std::size_t>(m)] = microbatch_samples(samples_, counters_.consumed_samples, m);
    for (const Sample& sample : batch[static_cast<std::size_t>(m)]) {
      local_counts[kInputTokens] += static_cast<double>(sample.input_tokens);
      local_counts[kLossTokens] += static_cast<double>(sample.loss_tokens);
      local_counts[kPadTokens] += static_cast<double>(sample.pad_tokens);
    }
    local_counts[kModelFlops] += model_flops(config_.model, batch[static_cast<std::size_t>(m)]);
  }
  const std::vector<double> counts = all_gather_values(*collectives_, local_counts);  // [DP, kSlots]
  double flops = 0.0;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const double* rank_counts = counts.data() + r * kSlots;
    record.input_tokens += static_cast<std::int64_t>(rank_counts[kInputTokens]);
    record.loss_tokens += static_cast<std::int64_t>(rank_counts[kLossTokens]);
    record.pad_tokens += static_cast<std::int64_t>(rank_counts[kPadTokens]);
    flops += rank_counts[kModelFlops];
  }
  const std::int64_t global_loss_tokens = record.loss_tokens;

  // 2. Forward/backward of every microbatch, fp32 main gradients accumulated across them.
  // SPEC 5 scales as the reference: 1/(global loss tokens) per-token; microbatch-mean
  // 1/(microbatch loss tokens x microbatches x DP); 0 without loss tokens. Rounded to fp32 once.
  main_grads_.zero();
  for (std::int64_t m = 0; m < microbatches; ++m) {
    const auto& samples = batch[static_cast<std::size_t>(m)];
    std::int64_t microbatch_loss_tokens = 0;
    for (const Sample& sample : samples) microbatch_loss_tokens += sample.loss_tokens;
    double loss_scale = 0.0;
    // Test-only mutant: the rank's own loss tokens as the per-token denominator.
    const std::int64_t denominator = options_.switches.mutants.rank_local_loss_denominator
                                         ? static_cast<std::int64_t>(local_counts[kLossTokens])
                                         : global_loss_tokens;
    if (per_token && denominator > 0) {
      loss_scale = 1.0 / static_cast<double>(denominator);
    } else if (!per_token && microbatch_loss_tokens > 0) {
      loss_scale = 1.0 / (static_cast<double>(microbatch_loss_tokens) *
                          static_cast<double>(microbatches * ranks));
    }
    model_->forward_backward(samples, compute_weights(), static_cast<float>(loss_scale),
                             main_grads_.data(), row_losses_.at(m * rows));
  }

  // 3. The reduction over replicas (DP > 1), then the test switch on the reduced gradient.
  reduce_gradients();
  if (options_.switches.nonfinite_gradient_iterations.count(record.iteration) != 0 && state_begin_ == 0 &&
      state_count_ > 0) {
    const float not_a_number = std::nanf("");
    backend_->copy_from_host(main_grads_.data(), &not_a_number, sizeof(float));
  }
  if (keep_last_gradient_) {
    if (distributed_) {
      collectives_->all_gather_in_place(main_grads_.data(),
                                        shards_.shard_elements * static_cast<std::int64_t>(sizeof(float)));
    }
    last_gradient_ = main_grads_.download(0, shards_.total);
  }

  // SPEC 5: the logged loss is the global token-weighted mean.
  const double loss_sum = global_loss_sum(0.0);
  last_loss_sum_ = loss_sum;
  double loss = global_loss_tokens > 0 ? loss_sum / static_cast<double>(global_loss_tokens) : 0.0;
  if (options_.switches.nonfinite_loss_iterations.count(record.iteration) != 0) {
    loss = options_.switches.nonfinite_loss_value;
  }
  record.loss = loss;

  // 4. SPEC 6: the norm from fixed-order partial sums: each rank's shard's blocks, gathered, and
  // summed in flat order (each element once).
  const std::int64_t shard = shards_.shard_elements;
  backend_->squared_norm(SquaredNormParams{main_grads_.at(collectives_->rank() * shard), norm_blocks_.data(),
                                           shard, kNormBlockElements});
  double sum_of_squares = 0.0;
  for (const double block : all_gather_values(*collectives_, norm_blocks_.download())) sum_of_squares += block;
  const double grad_norm = std::sqrt(sum_of_squares);
  record.grad_norm = grad_norm;
  // The norm the clip coefficient divides by. Test-only mutant: this rank's shard's norm (the
  // skip decision keeps the global norm, so the ranks still make the same collective calls).
  double clip_norm = grad_norm;
  if (options_.switches.mutants.shard_local_norm) {
    double own = 0.0;
    for (const double block : norm_blocks_.download()) own += block;
    clip_norm = std::sqrt(own);
  }

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
      const double coeff = config_.optimizer.clip_grad / (clip_norm + kClipNormEpsilon);
      if (coeff < 1.0) {
        clip_coeff = coeff;
        record.clipped = true;
        backend_->scale(ScaleParams{main_grads_.at(state_begin_), state_count_, static_cast<float>(coeff)});
      }
    }
    record.clip_coeff = clip_coeff;

    // 7. SPEC 7: fused AdamW over this rank's state range, then the compute copy.
    const std::int64_t step = counters_.successful_updates + 1;
    std::vector<AuditEntry> audit = audit_before_update(record);
    AdamwParams adamw;
    adamw.params = main_weights_.data();
    adamw.exp_avg = exp_avg_.data();
    adamw.exp_avg_sq = exp_avg_sq_.data();
    adamw.grads = main_grads_.at(state_begin_);
    adamw.compute_weights = compute_ == DType::f32 ? nullptr : compute_weights_.at(state_begin_);
    adamw.compute_dtype = compute_;
    adamw.count = state_count_;
    adamw.segments = segments_.data();
    adamw.segment_count = static_cast<std::int64_t>(segments_.size());
    adamw.hyper = adamw_hyper(config_.optimizer, step, lr, wd);
    backend_->adamw(adamw);
    if (distributed_) {
      // fp32 compute: the shard's new weights into the compute copy; then every rank's shard.
      if (compute_ == DType::f32 && state_count_ > 0) {
        backend_->copy(compute_weights_.at(state_begin_), main_weights_.data(),
                       state_count_ * static_cast<std::int64_t>(sizeof(float)));
      }
      collectives_->all_gather_in_place(compute_weights_.data(), shard * dtype_bytes(compute_));
    }

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
  record.model_flops = flops;
  // MFU over every rank's device: the global batch's FLOPs / (seconds x DP x peak).
  const double peak = backend_->peak_flops_per_second(compute_);
  if (peak > 0 && record.seconds > 0) {
    record.mfu = flops / record.seconds / (peak * static_cast<double>(ranks));
  }
  return record;
}

}  // namespace tandem::production
