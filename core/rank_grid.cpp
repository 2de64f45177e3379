// Megatron's rank grid (rank_grid.hpp).
#include "core/rank_grid.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace tandem {
namespace {

// 5120 -> "5,120" (ranks are never negative here).
std::string with_commas(std::int64_t value) {
  const std::string digits = std::to_string(value);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

void check_coordinate(const char* name, std::int64_t value, std::int64_t size) {
  if (value < 0 || value >= size) {
    throw std::out_of_range(std::string("rank grid: ") + name + " coordinate " + std::to_string(value) +
                            " is outside [0, " + std::to_string(size) + ")");
  }
}

}  // namespace

const char* to_string(RankGroupKind kind) {
  switch (kind) {
    case RankGroupKind::tensor: return "tensor";
    case RankGroupKind::context: return "context";
    case RankGroupKind::data: return "data";
    case RankGroupKind::data_context: return "data-context";
    case RankGroupKind::pipeline: return "pipeline";
    case RankGroupKind::model: return "model";
    case RankGroupKind::embedding: return "embedding";
  }
  return "?";
}

RankGrid::RankGrid(std::int64_t tensor, std::int64_t context, std::int64_t data, std::int64_t pipeline)
    : tensor_(tensor), context_(context), data_(data), pipeline_(pipeline) {
  std::int64_t world = 1;
  for (const auto& [name, size] : {std::pair{"--tensor-model-parallel-size", tensor},
                                   std::pair{"--context-parallel-size", context},
                                   std::pair{"data-parallel size", data},
                                   std::pair{"--pipeline-model-parallel-size", pipeline}}) {
    if (size < 1) {
      throw std::invalid_argument(std::string("rank grid: ") + name + " = " + std::to_string(size) +
                                  "; every parallel size is at least 1");
    }
    if (size > INT_MAX / world) {
      throw std::invalid_argument("rank grid: TP " + std::to_string(tensor) + " x CP " + std::to_string(context) +
                                  " x DP " + std::to_string(data) + " x PP " + std::to_string(pipeline) +
                                  " exceeds 2,147,483,647 ranks (MPI numbers ranks with an int)");
    }
    world *= size;
  }
}

RankGrid::RankGrid(const ParallelConfig& parallel)
    : RankGrid(parallel.tensor_parallel, parallel.context_parallel, parallel.data_parallel,
               parallel.pipeline_parallel) {}

RankCoordinates RankGrid::coordinates(std::int64_t rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw std::out_of_range("rank grid: rank " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(world_size()) + ") for " + describe());
  }
  RankCoordinates at;
  at.tensor = rank % tensor_;
  rank /= tensor_;
  at.context = rank % context_;
  rank /= context_;
  at.data = rank % data_;
  at.pipeline = rank / data_;
  return at;
}

std::int64_t RankGrid::rank_of(const RankCoordinates& at) const {
  check_coordinate("tensor", at.tensor, tensor_);
  check_coordinate("context", at.context, context_);
  check_coordinate("data", at.data, data_);
  check_coordinate("pipeline", at.pipeline, pipeline_);
  return at.tensor + tensor_ * (at.context + context_ * (at.data + data_ * at.pipeline));
}

std::int64_t RankGrid::group_count(RankGroupKind kind) const {
  switch (kind) {
    case RankGroupKind::tensor: return context_ * data_ * pipeline_;
    case RankGroupKind::context: return tensor_ * data_ * pipeline_;
    case RankGroupKind::data: return tensor_ * context_ * pipeline_;
    case RankGroupKind::data_context: return tensor_ * pipeline_;
    case RankGroupKind::pipeline: return tensor_ * context_ * data_;
    case RankGroupKind::model: return context_ * data_;
    case RankGroupKind::embedding: return tensor_ * context_ * data_;
  }
  return 0;
}

std::int64_t RankGrid::group_index(RankGroupKind kind, std::int64_t rank) const {
  const RankCoordinates at = coordinates(rank);
  // The index numbers the coordinates the group holds fixed, in the grid's order.
  switch (kind) {
    case RankGroupKind::tensor: return at.context + context_ * (at.data + data_ * at.pipeline);
    case RankGroupKind::context: return at.tensor + tensor_ * (at.data + data_ * at.pipeline);
    case RankGroupKind::data: return at.tensor + tensor_ * (at.context + context_ * at.pipeline);
    case RankGroupKind::data_context: return at.tensor + tensor_ * at.pipeline;
    case RankGroupKind::pipeline: return at.tensor + tensor_ * (at.context + context_ * at.data);
    case RankGroupKind::model: return at.context + context_ * at.data;
    case RankGroupKind::embedding:
      return is_embedding_stage(at.pipeline) ? group_index(RankGroupKind::pipeline, rank) : -1;
  }
  return -1;
}

std::vector<std::int64_t> RankGrid::members(RankGroupKind kind, std::int64_t rank) const {
  const RankCoordinates at = coordinates(rank);
  std::vector<std::int64_t> out;
  const auto add = [&](RankCoordinates member) { out.push_back(rank_of(member)); };
  switch (kind) {
    case RankGroupKind::tensor:
      for (std::int64_t tp = 0; tp < tensor_; ++tp) add({tp, at.context, at.data, at.pipeline});
      break;
    case RankGroupKind::context:
      for (std::int64_t cp = 0; cp < context_; ++cp) add({at.tensor, cp, at.data, at.pipeline});
      break;
    case RankGroupKind::data:
      for (std::int64_t dp = 0; dp < data_; ++dp) add({at.tensor, at.context, dp, at.pipeline});
      break;
    case RankGroupKind::data_context:
      for (std::int64_t dp = 0; dp < data_; ++dp) {
        for (std::int64_t cp = 0; cp < context_; ++cp) add({at.tensor, cp, dp, at.pipeline});
      }
      break;
    case RankGroupKind::pipeline:
      for (std::int64_t pp = 0; pp < pipeline_; ++pp) add({at.tensor, at.context, at.data, pp});
      break;
    case RankGroupKind::model:
      for (std::int64_t pp = 0; pp < pipeline_; ++pp) {
        for (std::int64_t tp = 0; tp < tensor_; ++tp) add({tp, at.context, at.data, pp});
      }
      break;
    case RankGroupKind::embedding:
      if (!is_embedding_stage(at.pipeline)) break;
      add({at.tensor, at.context, at.data, 0});
      if (pipeline_ > 1) add({at.tensor, at.context, at.data, pipeline_ - 1});
      break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::int64_t RankGrid::rank_in_group(RankGroupKind kind, std::int64_t rank) const {
  const std::vector<std::int64_t> group = members(kind, rank);
  const auto found = std::find(group.begin(), group.end(), rank);
  return found == group.end() ? -1 : static_cast<std::int64_t>(found - group.begin());
}

std::string RankGrid::describe() const {
  return "TP " + std::to_string(tensor_) + " x CP " + std::to_string(context_) + " x DP " +
         std::to_string(data_) + " x PP " + std::to_string(pipeline_) + " = " + with_commas(world_size()) +
         " ranks (Megatron's order tp-cp-dp-pp: TP fastest)";
}

std::string describe_ranks(const std::vector<std::int64_t>& ranks) {
  if (ranks.empty()) return "none";
  struct Run {
    std::int64_t first;
    std::int64_t last;
  };
  std::vector<Run> runs;
  for (const std::int64_t rank : ranks) {
    if (!runs.empty() && rank == runs.back().last + 1) {
      runs.back().last = rank;
    } else {
      runs.push_back({rank, rank});
    }
  }
  const auto text = [](const Run& run) {
    return run.first == run.last ? with_commas(run.first) : with_commas(run.first) + "-" + with_commas(run.last);
  };
  // Equal runs at an equal stride: first two, "...", last, and the count.
  constexpr std::size_t kShortenAbove = 4;
  bool regular = runs.size() > kShortenAbove;
  for (std::size_t i = 1; regular && i < runs.size(); ++i) {
    regular = runs[i].last - runs[i].first == runs[0].last - runs[0].first &&
              runs[i].first - runs[i - 1].first == runs[1].first - runs[0].first;
  }
  std::string out;
  if (regular) {
    const std::int64_t run_length = runs[0].last - runs[0].first + 1;
    const std::int64_t stride = runs[1].first - runs[0].first;
    out = text(runs[0]) + ", " + text(runs[1]) + ", ..., " + text(runs.back()) + ": " +
          with_commas(static_cast<std::int64_t>(ranks.size())) + " ranks, ";
    if (run_length > 1) out += std::to_string(runs.size()) + " runs of " + std::to_string(run_length) + ", ";
    out += "stride " + with_commas(stride);
    return out;
  }
  for (std::size_t i = 0; i < runs.size(); ++i) out += (i ? ", " : "") + text(runs[i]);
  return out + (ranks.size() > 1 ? ": " + with_commas(static_cast<std::int64_t>(ranks.size())) + " ranks" : "");
}

}  // namespace tandem
