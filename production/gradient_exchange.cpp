// The data-parallel exchange (gradient_exchange.hpp).
#include "production/gradient_exchange.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

GradientExchange::GradientExchange(Backend& backend, std::shared_ptr<Collectives> replicas, std::int64_t elements,
                                   const ExchangeOptions& options, std::shared_ptr<const StepHooks> hooks)
    : backend_(&backend), replicas_(std::move(replicas)), hooks_(std::move(hooks)) {
  const int ranks = replicas_->size();
  shards_ = make_flat_shards(elements, ranks, kNormBlockElements, options.bucket_parameters,
                             options.leading_elements);
  distributed_ = ranks > 1 && options.distributed_optimizer;
  overlap_grad_reduce_ = ranks > 1 && options.overlap_grad_reduce;
  overlap_param_gather_ = distributed_ && options.overlap_param_gather;
  lane_ = backend.make_comm_lane(replicas_->callable_from_other_threads());
  main_grads_ = Buffer<Real>(backend, shards_.padded());
  if (ranks > 1) {
    // The others' contributions to a slice arrive in rows of at most 2^25 elements in all.
    std::int64_t largest_slice = 0;
    for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
      largest_slice = std::max(largest_slice, shards_.slice(bucket));
    }
    constexpr std::int64_t kReceiveElements = std::int64_t{1} << 25;
    exchange_chunk_ = std::min(largest_slice, std::max(kNormBlockElements, kReceiveElements / (ranks - 1)));
    received_grads_ = Buffer<Real>(backend, (ranks - 1) * exchange_chunk_);
  }
  norm_blocks_ = Buffer<double>(backend, shards_.rank_elements() / kNormBlockElements);
}

std::vector<FlatRange> GradientExchange::kept_ranges() const {
  if (distributed_) return shards_.owned(replicas_->rank());
  return {FlatRange{0, shards_.total}};
}

void GradientExchange::begin_forward_backward(ComputeBuffer& compute_weights) {
  const std::size_t buckets = shards_.buckets.size();
  step_compute_ = &compute_weights;
  // --overlap-param-gather: every bucket's all-gather goes to the lane now, in flat order; the
  // forward waits for each just before it first reads weights in it (a lane's tickets complete
  // in order, so waiting for a bucket waits for those before it too).
  gathered_.assign(buckets, 0);
  if (gather_deferred_) {
    for (std::size_t bucket = 0; bucket < buckets; ++bucket) {
      gathered_[bucket] = lane_->submit([this, bucket] { gather_bucket(*step_compute_, bucket); });
    }
    gather_deferred_ = false;
  }
  // --overlap-grad-reduce: the elements of each bucket whose gradient the last microbatch's
  // backward has yet to finish; a bucket goes to the lane when its count reaches 0.
  unfinished_.assign(buckets, 0);
  for (std::size_t bucket = 0; bucket < buckets; ++bucket) {
    const GradientBucket& b = shards_.buckets[bucket];
    unfinished_[bucket] = std::max<std::int64_t>(0, std::min(b.begin + b.elements, shards_.total) - b.begin);
  }
  reduced_ = 0;
  main_grads_.zero();
}

ModelHooks GradientExchange::model_hooks(std::size_t microbatch, std::size_t microbatches) {
  ModelHooks hooks;
  if (microbatch == 0 && !gathered_.empty() && gathered_.front() != 0) {
    hooks.before_weights = [this](std::int64_t begin, std::int64_t end) {
      if (end > begin) lane_->wait(gathered_[shards_.bucket_of(end - 1)]);
    };
  }
  if (microbatch + 1 == microbatches && overlap_grad_reduce_) {
    hooks.gradients_done = [this](std::int64_t begin, std::int64_t end) {
      if (end <= begin) return;
      for (std::size_t bucket = shards_.bucket_of(begin); bucket <= shards_.bucket_of(end - 1); ++bucket) {
        const GradientBucket& b = shards_.buckets[bucket];
        unfinished_[bucket] -= std::min(end, b.begin + b.elements) - std::max(begin, b.begin);
        if (unfinished_[bucket] == 0) {
          lane_->submit([this, bucket] { reduce_bucket(bucket); });
          ++reduced_;
        }
      }
    };
  }
  return hooks;
}

void GradientExchange::finish_reduction() {
  lane_->drain();  // every gather waited for; every submitted reduction done before what follows
  if (replicas_->size() == 1) return;
  const std::size_t buckets = shards_.buckets.size();
  if (overlap_grad_reduce_ && reduced_ != buckets) {
    throw std::logic_error("Trainer: the backward finished " + std::to_string(reduced_) + " of " +
                           std::to_string(buckets) + " gradient buckets (the model's hooks missed elements)");
  }
  if (!overlap_grad_reduce_) {
    for (std::size_t bucket = 0; bucket < buckets; ++bucket) reduce_bucket(bucket);
  }
}

// SPEC 1 "reduction over replicas", one bucket at a time: in step k = 1 .. DP-1 rank r sends its
// contribution to the slice of rank (r + k) mod DP to that rank and receives the contribution of
// rank (r - k) mod DP to its own slice, into row k-1 of received_grads_; then it adds the DP
// contributions in rank order, ((g_0 + g_1) + g_2) + ..., in fp32 with the backend's add. A fixed
// order that is the same whichever rank owns an element, so neither the transport nor the buckets
// change a bit; each step moves one slice per rank (a ring's bandwidth). Slices longer than the
// receive rows go in chunks (the order of each element's sum is unchanged). The replicated
// optimizer then all-gathers the reduced slices of the bucket.
void GradientExchange::reduce_bucket(std::size_t bucket) {
  const int ranks = replicas_->size();
  const int rank = replicas_->rank();
  const std::int64_t slice = shards_.slice(bucket);
  const bool adds = hooks_ == nullptr || hooks_->adds_replica_contributions();  // StepHooks point
  for (std::int64_t first = 0; first < slice; first += exchange_chunk_) {
    const std::int64_t count = std::min(exchange_chunk_, slice - first);
    for (int step = 1; step < ranks; ++step) {
      const int to = (rank + step) % ranks;
      const int from = (rank - step + ranks) % ranks;
      replicas_->send_receive(main_grads_.at(shards_.slice_begin(bucket, to) + first), to,
                              received_grads_.at((step - 1) * exchange_chunk_), from, count);
    }
    if (adds) sum_in_rank_order(main_grads_.at(shards_.slice_begin(bucket, rank) + first), count);
  }
  if (!distributed_) {
    replicas_->all_gather_in_place(main_grads_.at(shards_.buckets[bucket].begin),
                                   slice * static_cast<std::int64_t>(sizeof(Real)));
  }
}

void GradientExchange::sum_in_rank_order(Real* mine, std::int64_t count) {
  const int ranks = replicas_->size();
  const int rank = replicas_->rank();
  // Rank q's contribution: this rank's own, or the row it arrived in (step (rank - q) mod DP).
  const auto theirs = [&](int q) { return received_grads_.at(((rank - q + ranks) % ranks - 1) * exchange_chunk_); };
  const auto add = [&](const Real* a, const Real* b, Real* out) {
    backend_->add(AddParams{a, b, out, count, DType::f32});
  };
  if (rank == 0) {
    for (int q = 1; q < ranks; ++q) add(mine, theirs(q), mine);
    return;
  }
  Real* below = theirs(0);  // the sum of ranks 0 .. rank-1, in rank 0's row
  for (int q = 1; q < rank; ++q) add(below, theirs(q), below);
  add(below, mine, mine);
  for (int q = rank + 1; q < ranks; ++q) add(mine, theirs(q), mine);
}

GradientNorm GradientExchange::norm(bool own_slices) {
  const int ranks = replicas_->size();
  const int rank = replicas_->rank();
  std::int64_t block = 0;
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    backend_->squared_norm(SquaredNormParams{main_grads_.at(shards_.slice_begin(bucket, rank)), norm_blocks_.at(block),
                                             shards_.slice(bucket), kNormBlockElements});
    block += shards_.slice(bucket) / kNormBlockElements;
  }
  std::vector<double> mine = norm_blocks_.download();
  if (hooks_ != nullptr && hooks_->sums_norm_squares_in_fp32()) mine = fp32_norm_blocks();  // StepHooks point
  const std::vector<double> blocks = all_gather_values(*replicas_, mine);  // [DP, block]
  double sum_of_squares = 0.0;
  std::int64_t first = 0;  // the bucket's first block in each rank's row
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    const std::int64_t count = shards_.slice(bucket) / kNormBlockElements;
    for (std::int64_t r = 0; r < ranks; ++r) {
      for (std::int64_t b = 0; b < count; ++b) sum_of_squares += blocks[static_cast<std::size_t>(r * block + first + b)];
    }
    first += count;
  }
  GradientNorm norm;
  norm.sum_of_squares = sum_of_squares;
  if (own_slices) {
    for (const double partial : mine) norm.own_sum_of_squares += partial;
  }
  return norm;
}

std::vector<double> GradientExchange::fp32_norm_blocks() const {
  const std::vector<Real> grads = main_grads_.download();
  std::vector<double> blocks;
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    const std::int64_t begin = shards_.slice_begin(bucket, replicas_->rank());
    for (std::int64_t block = 0; block < shards_.slice(bucket) / kNormBlockElements; ++block) {
      float sum = 0.0F;
      for (std::int64_t i = 0; i < kNormBlockElements; ++i) {
        const auto value = static_cast<float>(grads[static_cast<std::size_t>(begin + block * kNormBlockElements + i)]);
        sum += value * value;
      }
      blocks.push_back(sum);
    }
  }
  return blocks;
}

double GradientNorm::global() const { return std::sqrt(sum_of_squares); }
double GradientNorm::own_slices() const { return std::sqrt(own_sum_of_squares); }

void GradientExchange::gather_bucket(ComputeBuffer& compute, std::size_t bucket) {
  replicas_->all_gather_in_place(compute.at(shards_.buckets[bucket].begin),
                                 shards_.slice(bucket) * dtype_bytes(compute.dtype()));
}

void GradientExchange::publish_weights(ComputeBuffer& compute, WeightGather when) {
  gather_deferred_ = false;
  if (!distributed_) return;
  if (when == WeightGather::step && overlap_param_gather_) {
    gather_deferred_ = true;
    return;
  }
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) gather_bucket(compute, bucket);
}

void GradientExchange::finish_deferred_gathers(ComputeBuffer& compute) {
  if (!gather_deferred_) return;
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) gather_bucket(compute, bucket);
  gather_deferred_ = false;
}

std::vector<Real> GradientExchange::gather_flat(const Buffer<Real>& kept) const {
  if (!distributed_) return kept.download();
  Buffer<Real> whole(*backend_, shards_.padded());
  std::int64_t local = 0;
  for (const FlatRange& range : kept_ranges()) {
    backend_->copy(whole.at(range.begin), kept.at(local), range.count * static_cast<std::int64_t>(sizeof(Real)));
    local += range.count;
  }
  for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
    replicas_->all_gather_in_place(whole.at(shards_.buckets[bucket].begin),
                                   shards_.slice(bucket) * static_cast<std::int64_t>(sizeof(Real)));
  }
  return whole.download(0, shards_.total);
}

std::vector<Real> GradientExchange::gathered_gradients() {
  if (distributed_) {
    for (std::size_t bucket = 0; bucket < shards_.buckets.size(); ++bucket) {
      replicas_->all_gather_in_place(main_grads_.at(shards_.buckets[bucket].begin),
                                     shards_.slice(bucket) * static_cast<std::int64_t>(sizeof(Real)));
    }
  }
  return main_grads_.download(0, shards_.total);
}

}  // namespace tandem::production
