// The harness's own seam to the production trainer (twin.cpp uses it; not part of twin.hpp's
// interface): how a production twin is made, from either build of the production sources
// (production/arithmetic.hpp), and what the twins' descriptions share.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "equivalence/twin.hpp"

namespace tandem::equivalence {

// "DP 2 x 2 microbatches x mbs 1": a twin's layout for its description.
std::string layout_text(const RunConfig& config);

template <class Value>
std::vector<double> widen(const std::vector<Value>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(values[i]);
  return out;
}

struct ProductionTwinMaker {
  std::function<std::unique_ptr<Twin>(const TwinSetup&)> make;
  AdamwElementFunction adamw_element;  // the cpu backend's AdamW host twin; empty otherwise
};

// The production trainer (tandem_production, Real = float) on a backend; `mutant`: a
// production-side Mutant switched on (is_production_side), or none.
ProductionTwinMaker production_twin_maker(bool cuda, RankTransport transport, std::optional<Mutant> mutant);
// The same trainer from the semantic build (tandem_production_semantic, Real = double): the cpu
// backend; a bf16 case runs without --bf16 (the build has none).
ProductionTwinMaker semantic_production_twin_maker(RankTransport transport, std::optional<Mutant> mutant);
// The same trainer from the cuda-sim build (tandem_production_cuda_sim, docs/CUDA-SIM.md): the cuda
// backend with the shipped CUDA sources run on the CPU; ranks on threads of this process.
ProductionTwinMaker cuda_sim_production_twin_maker(std::optional<Mutant> mutant);

}  // namespace tandem::equivalence
