// The production trainer's whole-model state (trainer.hpp): this rank's pieces of the weights,
// m and v gathered into whole-model vectors over the tensor- and pipeline-parallel groups, the
// pieces a checkpoint saves (every element once among all ranks), and their restore.
#include "production/trainer.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

std::vector<FlatRange> Trainer::full_ranges_of(const std::vector<FlatRange>& local) const {
  std::vector<FlatRange> out;
  for (const FlatRange& range : local) {
    for (const FlatRange& full : split_.full_ranges(range)) out.push_back(full);
  }
  return out;
}

std::vector<Real> Trainer::gather_whole_model(const std::vector<Real>& local) const {
  if (split_.size() == 1 && split_.pipeline_size() == 1) return local;
  if (split_.size() == 1) {  // this stage's elements at their places
    std::vector<Real> whole(static_cast<std::size_t>(split_.full().total_elements), 0.0f);
    auto next = local.begin();
    for (const FlatRange& range : split_.full_ranges(FlatRange{0, layout_.total_elements})) {
      std::copy_n(next, range.count, whole.begin() + static_cast<std::ptrdiff_t>(range.begin));
      next += range.count;
    }
    return gather_over_pipeline(std::move(whole));
  }
  const std::int64_t count = layout_.total_elements;
  Buffer<Real> all(*backend_, count * split_.size());  // [TP, local N]
  backend_->copy_from_host(all.at(split_.rank() * count), local.data(), count * static_cast<std::int64_t>(sizeof(Real)));
  tp_group_->all_gather_in_place(all.data(), count * static_cast<std::int64_t>(sizeof(Real)));
  const std::vector<Real> parts = all.download();
  std::vector<Real> whole(static_cast<std::size_t>(split_.full().total_elements));
  for (int rank = 0; rank < split_.size(); ++rank) {
    const TensorParallelLayout theirs(config_.model, split_.size(), rank, *stages_, split_.pipeline_stage());
    auto next = parts.begin() + static_cast<std::ptrdiff_t>(rank * count);
    for (const FlatRange& range : theirs.full_ranges(FlatRange{0, count})) {
      std::copy_n(next, range.count, whole.begin() + static_cast<std::ptrdiff_t>(range.begin));
      next += range.count;
    }
  }
  // The replicated tensors are the same bits on every TP rank (the step computes them alike), a
  // shared key/value group on each of its holders: a rank that differs is a bug, never averaged
  // away.
  const auto holders_agree = [&](const FlatRange& range, int first_holder, int rank) {
    const auto first = parts.begin() + static_cast<std::ptrdiff_t>(first_holder * count + range.begin);
    if (!std::equal(first, first + range.count, parts.begin() + static_cast<std::ptrdiff_t>(rank * count + range.begin),
                    [](Real a, Real b) { return std::memcmp(&a, &b, sizeof(Real)) == 0; })) {
      throw std::logic_error("Trainer: tensor-parallel rank " + std::to_string(rank) + " holds other values than rank " +
                             std::to_string(first_holder) + " in the shared elements [" + std::to_string(range.begin) +
                             ", " + std::to_string(range.begin + range.count) + ") of its buffer");
    }
  };
  for (const FlatRange& range : split_.kv_shared_ranges()) {
    for (int rank = 0; rank < split_.size(); ++rank) holders_agree(range, rank - rank % split_.kv_sharing(), rank);
  }
  for (const FlatRange& range : split_.replicated_ranges()) {
    for (int rank = 1; rank < split_.size(); ++rank) {
      const auto first = parts.begin() + static_cast<std::ptrdiff_t>(range.begin);
      if (!std::equal(first, first + range.count, first + static_cast<std::ptrdiff_t>(rank * count),
                      [](Real a, Real b) { return std::memcmp(&a, &b, sizeof(Real)) == 0; })) {
        throw std::logic_error("Trainer: tensor-parallel rank " + std::to_string(rank) +
                               " holds other values than rank 0 in the replicated elements [" +
                               std::to_string(range.begin) + ", " + std::to_string(range.begin + range.count) +
                               ") of its buffer");
      }
    }
  }
  return split_.pipeline_size() == 1 ? whole : gather_over_pipeline(std::move(whole));
}

// Each stage's whole-model vector (its elements at their places) all-gathered over the pipeline
// group; every element taken from the stage that holds it, a tied embedding's two copies checked
// to be the same bits (the step gives both the same update: a difference is a bug).
std::vector<Real> Trainer::gather_over_pipeline(std::vector<Real> stage_whole) const {
  const auto count = static_cast<std::int64_t>(stage_whole.size());
  const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(Real));
  const std::int64_t stages = split_.pipeline_size();
  Buffer<Real> all(*backend_, count * stages);  // [PP, N]
  backend_->copy_from_host(all.at(split_.pipeline_stage() * count), stage_whole.data(), bytes);
  pipeline_group_->all_gather_in_place(all.data(), bytes);
  const std::vector<Real> parts = all.download();
  std::vector<Real> whole(static_cast<std::size_t>(count), 0.0f);
  std::vector<bool> taken(static_cast<std::size_t>(count), false);
  for (std::int64_t stage = 0; stage < stages; ++stage) {
    for (int tensor_rank = 0; tensor_rank < split_.size(); ++tensor_rank) {  // the stage's every TP block
      const TensorParallelLayout theirs(config_.model, split_.size(), tensor_rank, *stages_, stage);
      for (const FlatRange& range : theirs.full_ranges(FlatRange{0, theirs.local().total_elements})) {
        for (std::int64_t flat = range.begin; flat < range.begin + range.count; ++flat) {
          const Real value = parts[static_cast<std::size_t>(stage * count + flat)];
          if (!taken[static_cast<std::size_t>(flat)]) {
            whole[static_cast<std::size_t>(flat)] = value;
            taken[static_cast<std::size_t>(flat)] = true;
          } else if (std::memcmp(&whole[static_cast<std::size_t>(flat)], &value, sizeof(Real)) != 0) {
            throw std::logic_error("Trainer: pipeline stage " + std::to_string(stage) +
                                   " holds another value than stage 0 in the tied embedding's element " +
                                   std::to_string(flat));
          }
        }
      }
    }
  }
  return whole;
}

HostState Trainer::host_state() const {
  HostState state;
  state.params = gather_whole_model(exchange_.gather_flat(state_.weights()));
  state.exp_avg = gather_whole_model(exchange_.gather_flat(state_.exp_avg()));
  state.exp_avg_sq = gather_whole_model(exchange_.gather_flat(state_.exp_avg_sq()));
  state.counters = counters_;
  return state;
}

void Trainer::restore(const HostState& state) {
  const std::int64_t total = layout().total_elements;
  for (const auto* whole : {&state.params, &state.exp_avg, &state.exp_avg_sq}) {
    if (static_cast<std::int64_t>(whole->size()) != total) {
      throw std::invalid_argument("Trainer::restore: " + std::to_string(whole->size()) +
                                  " elements for a model of " + std::to_string(total));
    }
  }
  std::vector<MainStateSlice<Real>> pieces;
  for (const FlatRange& range : state_ranges()) {
    const auto part = [&range](const std::vector<Real>& values) {
      const auto first = values.begin() + range.begin;
      return std::vector<Real>(first, first + range.count);
    };
    pieces.push_back(MainStateSlice<Real>{range.begin, part(state.params), part(state.exp_avg), part(state.exp_avg_sq)});
  }
  restore(pieces, state.counters);
}

std::vector<MainStateSlice<Real>> Trainer::shard_pieces() const {
  // Each element once among all ranks: a replicated tensor is saved by TP rank 0 only, a shared
  // key/value group (G < TP) by its first holder, a tied embedding by the first stage.
  std::vector<FlatRange> saved;
  std::vector<FlatRange> replicated = split_.rank() == 0 ? std::vector<FlatRange>{} : split_.replicated_ranges();
  if (!split_.first_kv_holder()) {
    for (const FlatRange& range : split_.kv_shared_ranges()) replicated.push_back(range);
  }
  if (!split_.counts_embedding()) {  // the last stage's tied copy: stage 0 saves the embedding
    for (const FlatRange& range : split_.tied_embedding_ranges()) replicated.push_back(range);
  }
  std::sort(replicated.begin(), replicated.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  for (const FlatRange& range : exchange_.shards().owned(collectives_->rank())) {
    std::int64_t next = range.begin;
    const std::int64_t end = range.begin + range.count;
    for (const FlatRange& skip : replicated) {
      const std::int64_t skip_end = skip.begin + skip.count;
      if (skip_end <= next || skip.begin >= end) continue;
      if (skip.begin > next) saved.push_back(FlatRange{next, skip.begin - next});
      next = std::min(end, skip_end);
    }
    if (next < end) saved.push_back(FlatRange{next, end - next});
  }
  std::vector<MainStateSlice<Real>> out;
  for (const FlatRange& range : saved) {
    MainStateSlice<Real> local = state_.slice(range);  // it holds its slices with either optimizer
    std::int64_t offset = 0;
    for (const FlatRange& full : split_.full_ranges(range)) {
      const auto part = [&](const std::vector<Real>& values) {
        const auto first = values.begin() + offset;
        return std::vector<Real>(first, first + full.count);
      };
      out.push_back(MainStateSlice<Real>{full.begin, part(local.params), part(local.exp_avg), part(local.exp_avg_sq)});
      offset += full.count;
    }
  }
  return out;
}

std::vector<FlatRange> Trainer::state_ranges() const { return full_ranges_of(state_.ranges()); }

void Trainer::restore(std::span<const MainStateSlice<Real>> pieces, const Counters& counters) {
  // The whole-model pieces of state_ranges(), in its order, back into this rank's local pieces.
  const std::vector<FlatRange> wanted = state_ranges();
  if (pieces.size() != wanted.size()) {
    throw std::invalid_argument("Trainer::restore: " + std::to_string(pieces.size()) + " pieces for the " +
                                std::to_string(wanted.size()) + " ranges this rank keeps");
  }
  std::vector<MainStateSlice<Real>> local;
  std::size_t next = 0;
  for (const FlatRange& range : state_.ranges()) {
    MainStateSlice<Real> piece{range.begin, {}, {}, {}};
    for (const FlatRange& full : split_.full_ranges(range)) {
      const MainStateSlice<Real>& given = pieces[next];
      if (given.begin != full.begin || static_cast<std::int64_t>(given.params.size()) != full.count ||
          given.exp_avg.size() != given.params.size() || given.exp_avg_sq.size() != given.params.size()) {
        throw std::invalid_argument("Trainer::restore: piece " + std::to_string(next) + " (begin " +
                                    std::to_string(given.begin) + ", " + std::to_string(given.params.size()) +
                                    " elements) is not this rank's range [" + std::to_string(full.begin) + ", " +
                                    std::to_string(full.begin + full.count) + ")");
      }
      piece.params.insert(piece.params.end(), given.params.begin(), given.params.end());
      piece.exp_avg.insert(piece.exp_avg.end(), given.exp_avg.begin(), given.exp_avg.end());
      piece.exp_avg_sq.insert(piece.exp_avg_sq.end(), given.exp_avg_sq.begin(), given.exp_avg_sq.end());
      ++next;
    }
    local.push_back(std::move(piece));
  }
  state_.upload(local);
  counters_ = counters;
  publish_compute_weights(GradientExchange::WeightGather::now);
}

}  // namespace tandem::production
