// --audit-params for the production trainer (SPEC 12, `tandem audit`): the values of a few flat
// elements of the whole model before and after each AdamW update, as the reference's audit
// entries report them. The owner of each audited element (the TP rank holding it, TP rank 0 for a
// replicated tensor; of its data-parallel ranks the shard's rank with the distributed optimizer,
// else rank 0, whose whole state every rank equals) reads its values; one gather over every rank
// shares them, so every rank returns the same entries.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/model_layout.hpp"
#include "core/train/records.hpp"
#include "production/arithmetic.hpp"
#include "production/gradient_exchange.hpp"
#include "production/main_state_shard.hpp"
#include "production/tensor_parallel.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

class UpdateAudit {
 public:
  UpdateAudit(const TensorParallelLayout& split, const MainStateShard& state, const GradientExchange& exchange,
              Collectives& world)
      : split_(&split), state_(&state), exchange_(&exchange), world_(&world) {}

  // Which flat elements of the whole model to report (sorted); none: no entries and no exchange.
  void set_elements(std::vector<std::int64_t> elements) { elements_ = std::move(elements); }

  // Before AdamW: old value, gradient (clipped), old m and v, the record's lr and the wd of the
  // element's group. Collective when elements are set.
  std::vector<AuditEntry> before_update(const IterationRecord& record) const;
  // After AdamW: m, v, the new value and the step count.
  void after_update(std::vector<AuditEntry>& entries, std::int64_t step) const;

 private:
  // read(flat, local, out): the owner's values of an audited element (flat: its index in this
  // rank's buffer, local: its offset in the state buffers) into out[0 .. values_per_element).
  // Returns [elements, values_per_element] as the owners read them.
  using Read = std::function<void(std::int64_t flat, std::int64_t local, double* out)>;
  std::vector<double> owned_values(std::size_t values_per_element, const Read& read) const;

  const TensorParallelLayout* split_;
  const MainStateShard* state_;
  const GradientExchange* exchange_;
  Collectives* world_;
  std::vector<std::int64_t> elements_;
};

}  // namespace tandem::production
