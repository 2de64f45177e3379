// Megatron's rank grid: where each global rank sits in TP x CP x DP x PP, and which ranks form
// each of its process groups. Pure arithmetic, shared by the planner (`tandem plan --rank R`) and
// the production trainer, which makes one sub-communicator of its transport per group
// (production/collectives/).
//
// Megatron Core's default order "tp-cp-ep-dp-pp" (parallel_state.RankGenerator; expert
// parallelism is 1 for a dense model): TP varies fastest, then CP, then DP, then PP,
//   rank = tp + TP x (cp + CP x (dp + DP x pp)).
// A group of one kind holds the ranks that differ only in that kind's coordinates; its members
// are listed in increasing global rank, and a member's index in that list is its rank in the group.
//
//   kind          varies      groups            Megatron's name
//   tensor        tp          CP x DP x PP      tensor model parallel group
//   context       cp          TP x DP x PP      context parallel group
//   data          dp          TP x CP x PP      data parallel group (without CP)
//   data_context  dp, cp      TP x PP           data parallel group with CP (gradients reduce here)
//   pipeline      pp          TP x CP x DP      pipeline model parallel group
//   model         tp, pp      CP x DP           model parallel group (TP x PP)
//   embedding     first and last rank of each pipeline group (the tied embedding's two copies);
//                 with PP 1 the rank alone; ranks of the middle stages belong to none.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace tandem {

enum class RankGroupKind { tensor, context, data, data_context, pipeline, model, embedding };

// Every kind, in the order the planner prints them.
inline constexpr std::array<RankGroupKind, 7> kRankGroupKinds = {
    RankGroupKind::tensor,   RankGroupKind::context, RankGroupKind::data,     RankGroupKind::data_context,
    RankGroupKind::pipeline, RankGroupKind::model,   RankGroupKind::embedding};

// "tensor", "context", "data", "data-context", "pipeline", "model", "embedding".
const char* to_string(RankGroupKind kind);

struct RankCoordinates {
  std::int64_t tensor = 0;    // tp in [0, TP)
  std::int64_t context = 0;   // cp in [0, CP)
  std::int64_t data = 0;      // dp in [0, DP)
  std::int64_t pipeline = 0;  // pp in [0, PP): the pipeline stage
  bool operator==(const RankCoordinates&) const = default;
};

class RankGrid {
 public:
  // TP x CP x DP x PP ranks. Throws std::invalid_argument naming the size when one is below 1, or
  // when the world would exceed 2^31 - 1 ranks (MPI's int ranks).
  RankGrid(std::int64_t tensor, std::int64_t context, std::int64_t data, std::int64_t pipeline);
  // The grid of a validated configuration (its four sizes).
  explicit RankGrid(const ParallelConfig& parallel);

  std::int64_t tensor_size() const { return tensor_; }
  std::int64_t context_size() const { return context_; }
  std::int64_t data_size() const { return data_; }
  std::int64_t pipeline_size() const { return pipeline_; }
  std::int64_t world_size() const { return tensor_ * context_ * data_ * pipeline_; }

  // Throws std::out_of_range naming the rank and the world size when rank is not in [0, world).
  RankCoordinates coordinates(std::int64_t rank) const;
  // Throws std::out_of_range naming the coordinate out of its range.
  std::int64_t rank_of(const RankCoordinates& coordinates) const;

  // Which group of `kind` holds `rank`: an index in [0, group_count(kind)), the same for every
  // member (an MPI_Comm_split color); -1 for an embedding group the rank is not in.
  std::int64_t group_index(RankGroupKind kind, std::int64_t rank) const;
  std::int64_t group_count(RankGroupKind kind) const;
  // The members of the group of `kind` that holds `rank`, in increasing global rank (empty for an
  // embedding group the rank is not in).
  std::vector<std::int64_t> members(RankGroupKind kind, std::int64_t rank) const;
  // `rank`'s index in members(kind, rank); -1 when it is in no such group.
  std::int64_t rank_in_group(RankGroupKind kind, std::int64_t rank) const;

  // "TP 8 x CP 1 x DP 80 x PP 8 = 5,120 ranks (Megatron's order tp-cp-dp-pp: TP fastest)".
  std::string describe() const;

 private:
  bool is_embedding_stage(std::int64_t pipeline_stage) const {
    return pipeline_stage == 0 || pipeline_stage == pipeline_ - 1;
  }

  std::int64_t tensor_ = 1;
  std::int64_t context_ = 1;
  std::int64_t data_ = 1;
  std::int64_t pipeline_ = 1;
};

// A list of ranks for people: consecutive runs as "a-b", and a long list of equal runs at an
// equal stride shortened to its first two and last runs with the count ("1, 65, ..., 5,057: 80
// ranks, stride 64").
std::string describe_ranks(const std::vector<std::int64_t>& ranks);

}  // namespace tandem
