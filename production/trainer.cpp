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
  const int rank = collectives_->rank();
  shards_ = make_flat_shards(n, ranks, kNormBlockElements, gradient_bucket_parameters(config_.parallel));
  distributed_ = ranks > 1 && config_.parallel.use_distributed_optimizer;
  overlap_grad_reduce_ = ranks > 1 && config_.parallel.overlap_grad_reduce;
  overlap_param_gather_ = distributed_ && config_.parallel.overlap_param_gather;
  const std::vector<DecaySegment> segments = decay_segments(layout_);
  const std::vector<FlatRange> kept = distributed_ ? shards_.owned(rank) : std::vector<FlatRange>{{0, n}};
  for (const FlatRange& range : kept) {
    if (range.count == 0) continue;
    pieces_.push_back(StatePiece{range.begin, range.count, state_count_,
                                 segments_in_range(segments, range.begin, range.count)});
    state_count_ += range.count;
  }
  lane_ = backend_->make_comm_lane(collectives_->callable_from_other_threads());

  // SPEC 4: fp32 values, bit-identical to every engine's iteration 0; each rank keeps its pieces.
  const std::vector<float> initial = initial_parameters(config_.model, config_.data.seed);  // [N]
  main_weights_ = Buffer<float>(*backend_, state_count_);
  for (const StatePiece& piece : pieces_) {
    backend_->copy_from_host(main_weights_.at(piece.local), initial.data() + piece.begin,
                             piece.count * static_cast<std::int64_t>(sizeof(float)));
  }
  main_grads_ = Buffer<float>(*backend_, shards_.padded());
  if (ranks > 1) {
    // The others' contributions to a slice arrive in rows of at most 2^25 elements in all.
    std::int64_t largest_slice = 0;
    for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
      largest_slice = std::max(largest_slice, shards_.slice(bucket));
    }
    constexpr std::int64_t kReceiveElements = std::int64_t{1} << 25;
    exchange_chunk_ = std::min(largest_slice, std::max(kNormBlockElements, kReceiveElements / (ranks - 1)));
    received_grads_ = Buffer<float>(*backend_, (ranks - 1) * exchange_chunk_);
  }
  exp_avg_ = Buffer<float>(*backend_, state_count_);
  exp_avg_sq_ = Buffer<float>(*backend_, state_count_);
  if (compute_ != DType::f32 || distributed_) {
    compute_weights_ = ComputeBuffer(*backend_, compute_, shards_.padded());
  }
  publish_compute_weights();
  norm_blocks_ = Buffer<double>(*backend_, shards_.rank_elements() / kNormBlockElements);

  DecoderOptions decoder;
  decoder.micro_batch_size = config_.batch.micro_batch_size;
  decoder.logits_chunk_rows = options_.logits_chunk_rows;
  decoder.compute = compute_;
  model_ = std::make_unique<DecoderModel>(config_.model, layout_, *backend_, decoder);
  row_losses_ = Buffer<float>(*backend_, config_.microbatches_per_replica() * model_->rows());
}

// The compute weights from this rank's main state: converted (bf16) or copied (fp32 with the
// distributed optimizer) into the compute buffer at the pieces' places, then all-gathered from the
// slices' owners when the state is sharded. fp32 with a whole state: the main weights serve.
void Trainer::publish_compute_weights() {
  if (compute_weights_.size() == 0) return;
  for (const StatePiece& piece : pieces_) {
    backend_->convert(ConvertParams{main_weights_.at(piece.local), compute_weights_.at(piece.begin),
                                    piece.count, DType::f32, compute_});
  }
  gather_deferred_ = false;
  if (!distributed_) return;
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) gather_bucket_compute_weights(bucket);
}

void Trainer::gather_bucket_compute_weights(std::size_t bucket) {
  collectives_->all_gather_in_place(compute_weights_.at(shards_.buckets[bucket].begin),
                                    shards_.slice(bucket) * dtype_bytes(compute_));
}

void Trainer::finish_compute_weights() {
  if (!gather_deferred_) return;
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) gather_bucket_compute_weights(bucket);
  gather_deferred_ = false;
}

void Trainer::forward_backward_and_reduce(const std::vector<std::vector<Sample>>& batch,
                                          const std::vector<float>& loss_scales) {
  const std::int64_t rows = model_->rows();
  const std::size_t buckets = shards_.buckets.size();
  // --overlap-param-gather: every bucket's all-gather goes to the lane now, in flat order; the
  // forward waits for each just before it first reads weights in it (a lane's tickets complete
  // in order, so waiting for a bucket waits for those before it too).
  std::vector<CommLane::Ticket> gathered(buckets, 0);
  if (gather_deferred_) {
    for (std::size_t bucket = 0; bucket < buckets; ++bucket) {
      gathered[bucket] = lane_->submit([this, bucket] { gather_bucket_compute_weights(bucket); });
    }
    gather_deferred_ = false;
  }
  // --overlap-grad-reduce: the elements of each bucket whose gradient the last microbatch's
  // backward has yet to finish; a bucket goes to the lane when its count reaches 0.
  std::vector<std::int64_t> unfinished(buckets, 0);
  for (std::size_t bucket = 0; bucket < buckets; ++bucket) {
    const GradientBucket& b = shards_.buckets[bucket];
    unfinished[bucket] = std::max<std::int64_t>(0, std::min(b.begin + b.elements, shards_.total) - b.begin);
  }
  std::size_t reduced = 0;  // buckets handed to the lane

  // The hooks below capture this call's locals: the model drops them however the call ends.
  struct DropHooks {
    DecoderModel& model;
    ~DropHooks() { model.set_hooks({}); }
  } drop_hooks{*model_};
  main_grads_.zero();
  for (std::size_t m = 0; m < batch.size(); ++m) {
    ModelHooks hooks;
    if (m == 0 && gathered.front() != 0) {
      hooks.before_weights = [&](std::int64_t begin, std::int64_t end) {
        if (end > begin) lane_->wait(gathered[shards_.bucket_of(end - 1)]);
      };
    }
    if (m + 1 == batch.size() && overlap_grad_reduce_) {
      hooks.gradients_done = [&](std::int64_t begin, std::int64_t end) {
        if (end <= begin) return;
        for (std::size_t bucket = shards_.bucket_of(begin); bucket <= shards_.bucket_of(end - 1); ++bucket) {
          const GradientBucket& b = shards_.buckets[bucket];
          unfinished[bucket] -= std::min(end, b.begin + b.elements) - std::max(begin, b.begin);
          if (unfinished[bucket] == 0) {
            lane_->submit([this, bucket] { reduce_bucket(bucket); });
            ++reduced;
          }
        }
      };
    }
    model_->set_hooks(std::move(hooks));
    model_->forward_backward(batch[m], compute_weights(), loss_scales[m], main_grads_.data(),
                             row_losses_.at(static_cast<std::int64_t>(m) * rows));
  }
  lane_->drain();  // every gather waited for; every submitted reduction done before what follows
  if (collectives_->size() == 1) return;
  if (overlap_grad_reduce_ && reduced != buckets) {
    throw std::logic_error("Trainer: the backward finished " + std::to_string(reduced) + " of " +
                           std::to_string(buckets) + " gradient buckets (the model's hooks missed elements)");
  }
  if (!overlap_grad_reduce_) {
    for (std::size_t bucket = 0; bucket < buckets; ++bucket) reduce_bucket(bucket);
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
  finish_compute_weights();  // --overlap-param-gather deferred them to a forward
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

// SPEC 1 "reduction over replicas", one bucket at a time: in step k = 1 .. DP-1 rank r sends its
// contribution to the slice of rank (r + k) mod DP to that rank and receives the contribution of
// rank (r - k) mod DP to its own slice, into row k-1 of received_grads_; then it adds the DP
// contributions in rank order, ((g_0 + g_1) + g_2) + ..., in fp32 with the backend's add. A fixed
// order that is the same whichever rank owns an element, so neither the transport nor the buckets
// change a bit; each step moves one slice per rank (a ring's bandwidth). Slices longer than the
// receive rows go in chunks (the order of each element's sum is unchanged). The replicated
// optimizer then all-gathers the reduced slices of the bucket.
void Trainer::reduce_bucket(std::size_t bucket) {
  const int ranks = collectives_->size();
  const int rank = collectives_->rank();
  const std::int64_t slice = shards_.slice(bucket);
  for (std::int64_t first = 0; first < slice; first += exchange_chunk_) {
    const std::int64_t count = std::min(exchange_chunk_, slice - first);
    for (int step = 1; step < ranks; ++step) {
      const int to = (rank + step) % ranks;
      const int from = (rank - step + ranks) % ranks;
      collectives_->send_receive(main_grads_.at(shards_.slice_begin(bucket, to) + first), to,
                                 received_grads_.at((step - 1) * exchange_chunk_), from, count);
    }
    if (options_.switches.mutants.unreduced_gradients) continue;  // test-only mutant: own part only
    sum_in_rank_order(main_grads_.at(shards_.slice_begin(bucket, rank) + first), count);
  }
  if (!distributed_) {
    collectives_->all_gather_in_place(main_grads_.at(shards_.buckets[bucket].begin),
                                      slice * static_cast<std::int64_t>(sizeof(float)));
  }
}

void Trainer::sum_in_rank_order(float* mine, std::int64_t count) {
  const int ranks = collectives_->size();
  const int rank = collectives_->rank();
  // Rank q's contribution: this rank's own, or the row it arrived in (step (rank - q) mod DP).
  const auto theirs = [&](int q) { return received_grads_.at(((rank - q + ranks) % ranks - 1) * exchange_chunk_); };
  const auto add = [&](const float* a, const float* b, float* out) {
    backend_->add(AddParams{a, b, out, count, DType::f32});
  };
  if (rank == 0) {
    for (int q = 1; q < ranks; ++q) add(mine, theirs(q), mine);
    return;
  }
  float* below = theirs(0);  // the sum of ranks 0 .. rank-1, in rank 0's row
  for (int q = 1; q < rank; ++q) add(below, theirs(q), below);
  add(below, mine, mine);
  for (int q = rank + 1; q < ranks; ++q) add(mine, theirs(q), mine);
}

// The whole flat range [N] of a main-state buffer: downloaded when whole on this rank, else each
// rank's slices all-gathered, bucket by bucket, through a padded scratch buffer.
std::vector<float> Trainer::gather_flat(const Buffer<float>& state_range) const {
  if (!distributed_) return state_range.download();
  Buffer<float> whole(*backend_, shards_.padded());
  for (const StatePiece& piece : pieces_) {
    backend_->copy(whole.at(piece.begin), state_range.at(piece.local),
                   piece.count * static_cast<std::int64_t>(sizeof(float)));
  }
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    collectives_->all_gather_in_place(whole.at(shards_.buckets[bucket].begin),
                                      shards_.slice(bucket) * static_cast<std::int64_t>(sizeof(float)));
  }
  return whole.download(0, shards_.total);
}

std::int64_t Trainer::local_offset(std::int64_t flat) const {
  for (const StatePiece& piece : pieces_) {
    if (flat >= piece.begin && flat < piece.begin + piece.count) return piece.local + (flat - piece.begin);
  }
  return -1;
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
  std::vector<MainStateSlice<float>> pieces;
  for (const FlatRange& range : state_ranges()) {
    const auto part = [&range](const std::vector<float>& values) {
      const auto first = values.begin() + range.begin;
      return std::vector<float>(first, first + range.count);
    };
    pieces.push_back(MainStateSlice<float>{range.begin, part(state.params), part(state.exp_avg), part(state.exp_avg_sq)});
  }
  restore(pieces, state.counters);
}

std::vector<MainStateSlice<float>> Trainer::shard_pieces() const {
  std::vector<MainStateSlice<float>> out;
  for (const FlatRange& range : shards_.owned(collectives_->rank())) {
    const std::int64_t local = local_offset(range.begin);  // it holds its slices either way
    out.push_back(MainStateSlice<float>{range.begin, main_weights_.download(local, range.count),
                                        exp_avg_.download(local, range.count),
                                        exp_avg_sq_.download(local, range.count)});
  }
  return out;
}

std::vector<FlatRange> Trainer::state_ranges() const {
  std::vector<FlatRange> ranges;
  for (const StatePiece& piece : pieces_) ranges.push_back(FlatRange{piece.begin, piece.count});
  return ranges;
}

void Trainer::restore(std::span<const MainStateSlice<float>> pieces, const Counters& counters) {
  const auto describe = [](std::int64_t begin, std::int64_t count) {
    return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
  };
  if (pieces.size() != pieces_.size()) {
    throw std::invalid_argument("Trainer::restore: " + std::to_string(pieces.size()) + " pieces for the " +
                                std::to_string(pieces_.size()) + " ranges this rank keeps");
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const MainStateSlice<float>& piece = pieces[i];
    const StatePiece& mine = pieces_[i];
    const auto size = static_cast<std::int64_t>(piece.params.size());
    if (piece.begin != mine.begin || size != mine.count || static_cast<std::int64_t>(piece.exp_avg.size()) != size ||
        static_cast<std::int64_t>(piece.exp_avg_sq.size()) != size) {
      throw std::invalid_argument("Trainer::restore: the piece " + describe(piece.begin, size) +
                                  " is not this rank's range " + describe(mine.begin, mine.count));
    }
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const StatePiece& mine = pieces_[i];
    const auto bytes = mine.count * static_cast<std::int64_t>(sizeof(float));
    backend_->copy_from_host(main_weights_.at(mine.local), pieces[i].params.data(), bytes);
    backend_->copy_from_host(exp_avg_.at(mine.local), pieces[i].exp_avg.data(), bytes);
    backend_->copy_from_host(exp_avg_sq_.at(mine.local), pieces[i].exp_avg_sq.data(), bytes);
  }
  counters_ = counters;
  publish_compute_weights();
}

// --audit-params: the owner of each audited element (the shard's rank with the distributed
// optimizer, else rank 0, whose whole state every rank equals) reads its values with `read`; one
// gather shares them. Returns [elements, values_per_element] as the owners read them.
std::vector<double> Trainer::audited_values(std::size_t values_per_element,
                                            const AuditRead& read) const {
  const std::size_t count = audit_elements_.size() * values_per_element;
  std::vector<double> mine(count, 0.0);
  for (std::size_t i = 0; i < audit_elements_.size(); ++i) {
    const std::int64_t local = local_offset(audit_elements_[i]);
    if (local >= 0) read(audit_elements_[i], local, mine.data() + i * values_per_element);
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

  // 2. Forward/backward of every microbatch, fp32 main gradients accumulated across them, and the
  // reduction over replicas (DP > 1). SPEC 5 scales as the reference: 1/(global loss tokens)
  // per-token; microbatch-mean 1/(microbatch loss tokens x microbatches x DP); 0 without loss
  // tokens. Rounded to fp32 once.
  std::vector<float> loss_scales;
  for (const auto& samples : batch) {
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
    loss_scales.push_back(static_cast<float>(loss_scale));
  }
  forward_backward_and_reduce(batch, loss_scales);

  // 3. The test switch on the reduced gradient (element 0, where it is kept).
  if (options_.switches.nonfinite_gradient_iterations.count(record.iteration) != 0 && local_offset(0) >= 0) {
    const float not_a_number = std::nanf("");
    backend_->copy_from_host(main_grads_.data(), &not_a_number, sizeof(float));
  }
  if (keep_last_gradient_) {
    if (distributed_) {
      for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
        collectives_->all_gather_in_place(main_grads_.at(shards_.buckets[bucket].begin),
                                          shards_.slice(bucket) * static_cast<std::int64_t>(sizeof(float)));
      }
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

  // 4. SPEC 6: the norm from fixed-order partial sums: the blocks of each rank's slices, gathered,
  // and summed in flat order (bucket, then rank, then block: each element once).
  const int rank = collectives_->rank();
  std::int64_t block = 0;
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    backend_->squared_norm(SquaredNormParams{main_grads_.at(shards_.slice_begin(bucket, rank)), norm_blocks_.at(block),
                                             shards_.slice(bucket), kNormBlockElements});
    block += shards_.slice(bucket) / kNormBlockElements;
  }
  const std::vector<double> blocks = all_gather_values(*collectives_, norm_blocks_.download());  // [DP, block]
  double sum_of_squares = 0.0;
  std::int64_t first = 0;  // the bucket's first block in each rank's row
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    const std::int64_t count = shards_.slice(bucket) / kNormBlockElements;
    for (std::int64_t r = 0; r < ranks; ++r) {
      for (std::int64_t b = 0; b < count; ++b) sum_of_squares += blocks[static_cast<std::size_t>(r * block + first + b)];
    }
    first += count;
  }
  const double grad_norm = std::sqrt(sum_of_squares);
  record.grad_norm = grad_norm;
  // The norm the clip coefficient divides by. Test-only mutant: this rank's slices' norm (the
  // skip decision keeps the global norm, so the ranks still make the same collective calls).
  double clip_norm = grad_norm;
  if (options_.switches.mutants.shard_local_norm) {
    double own = 0.0;
    for (const double partial : norm_blocks_.download()) own += partial;
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
        for (const StatePiece& piece : pieces_) {
          backend_->scale(ScaleParams{main_grads_.at(piece.begin), piece.count, static_cast<float>(coeff)});
        }
      }
    }
    record.clip_coeff = clip_coeff;

    // 7. SPEC 7: fused AdamW over each piece of this rank's state, then the compute copy.
    const std::int64_t step = counters_.successful_updates + 1;
    std::vector<AuditEntry> audit = audit_before_update(record);
    for (const StatePiece& piece : pieces_) {
      AdamwParams adamw;
      adamw.params = main_weights_.at(piece.local);
      adamw.exp_avg = exp_avg_.at(piece.local);
      adamw.exp_avg_sq = exp_avg_sq_.at(piece.local);
      adamw.grads = main_grads_.at(piece.begin);
      adamw.compute_weights = compute_ == DType::f32 ? nullptr : compute_weights_.at(piece.begin);
      adamw.compute_dtype = compute_;
      adamw.count = piece.count;
      adamw.segments = piece.segments.data();
      adamw.segment_count = static_cast<std::int64_t>(piece.segments.size());
      adamw.hyper = adamw_hyper(config_.optimizer, step, lr, wd);
      backend_->adamw(adamw);
    }
    if (distributed_) {
      // fp32 compute: the slices' new weights into the compute copy. Then every rank's slices:
      // now, or bucket by bucket in the next forward (--overlap-param-gather).
      if (compute_ == DType::f32) {
        for (const StatePiece& piece : pieces_) {
          backend_->copy(compute_weights_.at(piece.begin), main_weights_.at(piece.local),
                         piece.count * static_cast<std::int64_t>(sizeof(float)));
        }
      }
      if (overlap_param_gather_) {
        gather_deferred_ = true;
      } else {
        for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) gather_bucket_compute_weights(bucket);
      }
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
