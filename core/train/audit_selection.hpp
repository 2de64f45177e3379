// Which parameter elements --audit-params logs (SPEC 12), shared by both twins so their logs
// audit the same elements: `count` elements chosen by `seed`, alternating between the decay and
// no-decay groups while both have elements (flat indices, sorted).
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_layout.hpp"

namespace tandem {

std::vector<std::int64_t> audit_elements(const ModelLayout& layout, std::int64_t count,
                                         std::uint64_t seed);

}  // namespace tandem
