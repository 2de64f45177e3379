// The production trainer's audit entries (update_audit.hpp).
#include "production/update_audit.hpp"

#include <algorithm>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

std::vector<double> UpdateAudit::owned_values(std::size_t values_per_element, const Read& read) const {
  // Each element's row: its values, then 1 on the owner's row (0 elsewhere).
  const std::size_t row = values_per_element + 1;
  const std::size_t count = elements_.size() * row;
  std::vector<double> mine(count, 0.0);
  const std::int64_t replica = exchange_->replicas().rank();
  for (std::size_t i = 0; i < elements_.size(); ++i) {
    const std::int64_t flat = split_->local_index(elements_[i]);
    if (flat < 0) continue;  // another TP rank's or pipeline stage's
    const TensorShard* shard = nullptr;
    for (std::size_t t = 0; t < split_->local().tensors.size(); ++t) {
      const ParameterTensor& tensor = split_->local().tensors[t];
      if (flat >= tensor.offset && flat < tensor.offset + tensor.numel) shard = &split_->shard(static_cast<std::int64_t>(t));
    }
    const bool tp_owner = shard->split != TensorSplit::replicated || split_->rank() == 0;
    const std::vector<FlatRange> tied = split_->counts_embedding() ? std::vector<FlatRange>{}
                                                                   : split_->tied_embedding_ranges();
    const bool stage_owner = std::none_of(tied.begin(), tied.end(), [flat](const FlatRange& copy) {
      return flat >= copy.begin && flat < copy.begin + copy.count;  // the last stage's tied copy
    });
    const bool dp_owner = exchange_->distributed() ? exchange_->shards().owner(flat) == replica : replica == 0;
    if (!tp_owner || !dp_owner || !stage_owner) continue;
    read(flat, state_->local_offset(flat), mine.data() + i * row);
    mine[i * row + values_per_element] = 1.0;
  }
  const std::vector<double> all = world_->size() == 1 ? mine : all_gather_values(*world_, mine);  // [ranks, count]
  std::vector<double> owned(elements_.size() * values_per_element);
  for (std::size_t i = 0; i < elements_.size(); ++i) {
    for (std::size_t rank = 0; rank * count < all.size(); ++rank) {
      const double* values = all.data() + rank * count + i * row;
      if (values[values_per_element] != 1.0) continue;
      std::copy_n(values, values_per_element, owned.begin() + static_cast<std::ptrdiff_t>(i * values_per_element));
    }
  }
  return owned;
}

std::vector<AuditEntry> UpdateAudit::before_update(const IterationRecord& record) const {
  if (elements_.empty()) return {};  // the same on every rank: no exchange to skip alone
  constexpr std::size_t kValues = 4;  // old value, gradient, old m, old v
  // The fp32 values, widened exactly (SPEC 12: tandem audit reads "main_precision":"fp32").
  const std::vector<double> values = owned_values(kValues, [this](std::int64_t flat, std::int64_t local, double* out) {
    out[0] = state_->weights().download(local, 1).front();
    out[1] = exchange_->main_grads().download(flat, 1).front();
    out[2] = state_->exp_avg().download(local, 1).front();
    out[3] = state_->exp_avg_sq().download(local, 1).front();
  });
  std::vector<AuditEntry> entries;
  const ModelLayout& layout = split_->full();
  std::size_t tensor = 0;
  for (std::size_t i = 0; i < elements_.size(); ++i) {
    const std::int64_t flat = elements_[i];
    while (layout.tensors[tensor].offset + layout.tensors[tensor].numel <= flat) ++tensor;
    const ParameterTensor& owner = layout.tensors[tensor];
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

void UpdateAudit::after_update(std::vector<AuditEntry>& entries, std::int64_t step) const {
  if (elements_.empty()) return;
  constexpr std::size_t kValues = 3;  // m, v, new value
  const std::vector<double> values = owned_values(kValues, [this](std::int64_t, std::int64_t local, double* out) {
    out[0] = state_->exp_avg().download(local, 1).front();
    out[1] = state_->exp_avg_sq().download(local, 1).front();
    out[2] = state_->weights().download(local, 1).front();
  });
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const double* element = values.data() + i * kValues;
    entries[i].m = element[0];
    entries[i].v = element[1];
    entries[i].new_value = element[2];
    entries[i].step = step;
  }
}

}  // namespace tandem::production
