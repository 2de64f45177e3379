// The production trainer's gradient sums beyond the data-parallel reduction (trainer.hpp): the
// tied embedding's two copies over the embedding group, the replicated and shared key/value
// tensors over tensor parallelism, and SPEC 6's norm with every element counted once.
#include "production/trainer.hpp"

#include <algorithm>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// PP > 1, tied: the two copies' gradients, each reduced over its stage's replicas, summed first +
// last in fp32 over the embedding group where this rank keeps them (the leading buckets give both
// stages' DP rank r the same slices: gradient_exchange.hpp ExchangeOptions::leading_elements).
void Trainer::sum_tied_embedding_gradients() {
  if (!hooks().sums_tied_embedding_gradients()) return;  // StepHooks point
  for (const FlatRange& tied : split_.tied_embedding_ranges()) {
    for (const FlatRange& kept : exchange_.kept_ranges()) {
      const std::int64_t begin = std::max(tied.begin, kept.begin);
      const std::int64_t end = std::min(tied.begin + tied.count, kept.begin + kept.count);
      if (begin < end) embedding_comm_.all_reduce(exchange_.main_grads().at(begin), end - begin);
    }
  }
}

// With --sequence-parallel each TP rank's norm weights and row-parallel biases saw its part of
// the rows only: their reduced gradients are summed over TP, in rank order, where this rank keeps
// them (Megatron's all-reduce of the sequence-parallel gradients after the data-parallel one).
// Without it they are the same on every TP rank already. With G < TP the key/value rows a group's
// TP/G holders share got from each holder the gradient of its own query heads only: summed too.
void Trainer::sum_replicated_gradients_over_tp() {
  if (split_.size() == 1) return;
  if (sequence_parallel() && hooks().sums_sequence_parallel_gradients()) {  // StepHooks point
    for (const FlatRange& replicated : split_.replicated_ranges()) {
      for (const FlatRange& kept : exchange_.kept_ranges()) {
        const std::int64_t begin = std::max(replicated.begin, kept.begin);
        const std::int64_t end = std::min(replicated.begin + replicated.count, kept.begin + kept.count);
        if (begin < end) tp_comm_.all_reduce(exchange_.main_grads().at(begin), end - begin);
      }
    }
  }
  sum_shared_key_value_gradients();
}

// G < TP: each kept piece of the shared key/value rows goes into its group's slot of a buffer of
// G slots, zeros elsewhere, summed over TP in rank order: slot g is then ((0 + ...) + x_a) + x_b
// ... over group g's holders in rank order (adding the other groups' exact zeros changes no
// value), the same bits on every holder; the holders take their slot back.
void Trainer::sum_shared_key_value_gradients() {
  if (split_.kv_sharing() == 1) return;
  const std::int64_t slots = split_.size() / split_.kv_sharing();  // G
  const auto element = static_cast<std::int64_t>(sizeof(Real));
  for (const FlatRange& shared : split_.kv_shared_ranges()) {
    for (const FlatRange& kept : exchange_.kept_ranges()) {
      const std::int64_t begin = std::max(shared.begin, kept.begin);
      const std::int64_t end = std::min(shared.begin + shared.count, kept.begin + kept.count);
      if (begin >= end) continue;
      const std::int64_t count = end - begin;
      Buffer<Real> groups(*backend_, slots * count);  // [G, count]
      groups.zero();
      Real* mine = groups.at(split_.kv_group_begin() * count);
      backend_->copy(mine, exchange_.main_grads().at(begin), count * element);
      tp_comm_.all_reduce(groups.data(), slots * count);
      backend_->copy(exchange_.main_grads().at(begin), mine, count * element);
    }
  }
}

// SPEC 6 under tensor parallelism: each TP rank's squared norm over its part (the data-parallel
// exchange's fixed order), the replicated tensors counted on TP rank 0 only (every element once:
// the other ranks' copies are set to 0 for the sum, an exact no-op, then put back), and the TP
// ranks' sums added in rank order.
GradientNorm Trainer::gradient_norm(bool own_slices) {
  if (split_.size() == 1 && split_.pipeline_size() == 1) return exchange_.norm(own_slices);
  std::vector<std::vector<Real>> saved;
  const std::vector<FlatRange> uncounted = not_counted_here();
  for (const FlatRange& range : uncounted) {
    saved.push_back(exchange_.main_grads().download(range.begin, range.count));
    backend_->fill_zero(exchange_.main_grads().at(range.begin), range.count * static_cast<std::int64_t>(sizeof(Real)));
  }
  GradientNorm mine = exchange_.norm(own_slices);
  std::size_t next = 0;
  for (const FlatRange& range : uncounted) {
    backend_->copy_from_host(exchange_.main_grads().at(range.begin), saved[next++].data(),
                             range.count * static_cast<std::int64_t>(sizeof(Real)));
  }
  const double sums[2] = {mine.sum_of_squares, mine.own_sum_of_squares};
  const std::vector<double> all = all_gather_values(*tp_group_, sums);  // [TP, 2]
  GradientNorm stage;
  for (int rank = 0; rank < split_.size(); ++rank) {
    stage.sum_of_squares += all[static_cast<std::size_t>(2 * rank)];
    stage.own_sum_of_squares += all[static_cast<std::size_t>(2 * rank + 1)];
  }
  if (split_.pipeline_size() == 1 || !hooks().sums_norm_over_stages()) return stage;  // StepHooks point
  // The stages' sums in stage order (every TP rank of a stage holds the same).
  const double stage_sums[2] = {stage.sum_of_squares, stage.own_sum_of_squares};
  const std::vector<double> stages = all_gather_values(*pipeline_group_, stage_sums);  // [PP, 2]
  GradientNorm norm;
  for (std::int64_t s = 0; s < split_.pipeline_size(); ++s) {
    norm.sum_of_squares += stages[static_cast<std::size_t>(2 * s)];
    norm.own_sum_of_squares += stages[static_cast<std::size_t>(2 * s + 1)];
  }
  return norm;
}

std::vector<FlatRange> Trainer::not_counted_here() const {
  std::vector<FlatRange> out;
  if (split_.rank() != 0 && hooks().counts_replicated_once()) out = split_.replicated_ranges();  // StepHooks point
  if (!split_.first_kv_holder()) {
    for (const FlatRange& range : split_.kv_shared_ranges()) out.push_back(range);
  }
  if (!split_.counts_embedding() && hooks().counts_tied_embedding_once()) {  // StepHooks point
    for (const FlatRange& range : split_.tied_embedding_ranges()) out.push_back(range);
  }
  std::sort(out.begin(), out.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  return out;
}

}  // namespace tandem::production
