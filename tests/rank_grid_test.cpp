// Megatron's rank grid (core/rank_grid.hpp): every rank's coordinates and every group of every
// kind, exhaustively at the seed's 5,120 ranks and on odd shapes: consistent (each member sees the
// same group), disjoint and covering, and each group varying exactly its kind's coordinates.
#include "core/rank_grid.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

namespace tandem {
namespace {

// Whether `kind`'s groups vary each coordinate: {tensor, context, data, pipeline}.
std::array<bool, 4> varies(RankGroupKind kind) {
  switch (kind) {
    case RankGroupKind::tensor: return {true, false, false, false};
    case RankGroupKind::context: return {false, true, false, false};
    case RankGroupKind::data: return {false, false, true, false};
    case RankGroupKind::data_context: return {false, true, true, false};
    case RankGroupKind::pipeline: return {false, false, false, true};
    case RankGroupKind::model: return {true, false, false, true};
    case RankGroupKind::embedding: return {false, false, false, true};
  }
  return {};
}

std::array<std::int64_t, 4> as_array(const RankCoordinates& at) {
  return {at.tensor, at.context, at.data, at.pipeline};
}

// Checks every rank and every group of `grid`; the failure message names the grid, kind and rank.
void expect_consistent_disjoint_covering(const RankGrid& grid) {
  const std::int64_t world = grid.world_size();
  const std::array<std::int64_t, 4> sizes = {grid.tensor_size(), grid.context_size(), grid.data_size(),
                                             grid.pipeline_size()};
  for (std::int64_t rank = 0; rank < world; ++rank) {
    ASSERT_EQ(grid.rank_of(grid.coordinates(rank)), rank) << grid.describe();
  }
  for (const RankGroupKind kind : kRankGroupKinds) {
    const auto varying = varies(kind);
    std::int64_t expected_size = 1;
    for (std::size_t axis = 0; axis < 4; ++axis) expected_size *= varying[axis] ? sizes[axis] : 1;
    if (kind == RankGroupKind::embedding) expected_size = grid.pipeline_size() > 1 ? 2 : 1;
    std::map<std::int64_t, std::vector<std::int64_t>> groups;  // index -> members
    std::int64_t ranks_in_a_group = 0;
    for (std::int64_t rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(std::string(to_string(kind)) + " group of rank " + std::to_string(rank) + " in " + grid.describe());
      const std::vector<std::int64_t> members = grid.members(kind, rank);
      const std::int64_t index = grid.group_index(kind, rank);
      const RankCoordinates at = grid.coordinates(rank);
      if (kind == RankGroupKind::embedding && at.pipeline != 0 && at.pipeline != grid.pipeline_size() - 1) {
        ASSERT_TRUE(members.empty());  // a middle stage holds no embedding
        ASSERT_EQ(index, -1);
        ASSERT_EQ(grid.rank_in_group(kind, rank), -1);
        continue;
      }
      ++ranks_in_a_group;
      ASSERT_EQ(static_cast<std::int64_t>(members.size()), expected_size);
      ASSERT_TRUE(std::is_sorted(members.begin(), members.end()));
      ASSERT_TRUE(std::adjacent_find(members.begin(), members.end()) == members.end());
      ASSERT_GE(index, 0);
      ASSERT_LT(index, grid.group_count(kind));
      const auto position = std::find(members.begin(), members.end(), rank);
      ASSERT_NE(position, members.end());
      ASSERT_EQ(grid.rank_in_group(kind, rank), position - members.begin());
      // Every member agrees on the fixed coordinates and sees the same group with the same index.
      for (const std::int64_t member : members) {
        const auto theirs = as_array(grid.coordinates(member));
        const auto mine = as_array(at);
        for (int axis = 0; axis < 4; ++axis) {
          const auto at_axis = static_cast<std::size_t>(axis);
          if (!varying[at_axis]) {
            ASSERT_EQ(theirs[at_axis], mine[at_axis]) << "member " << member;
          }
        }
        ASSERT_EQ(grid.group_index(kind, member), index) << "member " << member;
      }
      const auto [entry, inserted] = groups.emplace(index, members);
      if (!inserted) {
        ASSERT_EQ(entry->second, members) << "two groups share index " << index;
      }
    }
    SCOPED_TRACE(std::string(to_string(kind)) + " groups of " + grid.describe());
    // Disjoint and covering: the groups' members are every grouped rank exactly once.
    std::set<std::int64_t> seen;
    for (const auto& [index, members] : groups) {
      for (const std::int64_t member : members) ASSERT_TRUE(seen.insert(member).second) << "rank " << member << " in two groups";
    }
    ASSERT_EQ(static_cast<std::int64_t>(seen.size()), ranks_in_a_group);
    ASSERT_EQ(static_cast<std::int64_t>(groups.size()), grid.group_count(kind));
    if (kind != RankGroupKind::embedding) {
      ASSERT_EQ(ranks_in_a_group, world);
    }
  }
}

TEST(RankGrid, TheSeedsFiveThousandRanksEveryGroupConsistentDisjointCovering) {
  const RankGrid seed(8, 1, 80, 8);
  ASSERT_EQ(seed.world_size(), 5120);
  expect_consistent_disjoint_covering(seed);
}

TEST(RankGrid, OddShapesEveryGroupConsistentDisjointCovering) {
  for (const auto& [tp, cp, dp, pp] : std::vector<std::array<std::int64_t, 4>>{
           {1, 1, 1, 1}, {3, 1, 5, 2}, {1, 2, 3, 1}, {2, 2, 2, 2}, {7, 1, 1, 3}, {1, 3, 1, 4}, {5, 2, 3, 7}, {1, 1, 6, 1}}) {
    expect_consistent_disjoint_covering(RankGrid(tp, cp, dp, pp));
  }
}

TEST(RankGrid, GpuFourThousandNinetySevenOfTheSeedSitsAtTp1Dp32Stage6) {
  const RankGrid seed(8, 1, 80, 8);
  // 4097 = 1 + 8 x (0 + 1 x (32 + 80 x 6)): TP fastest, then CP, DP, PP.
  EXPECT_EQ(seed.coordinates(4097), (RankCoordinates{1, 0, 32, 6}));
  EXPECT_EQ(seed.rank_of({1, 0, 32, 6}), 1 + 8 * (32 + 80 * 6));
  EXPECT_EQ(seed.members(RankGroupKind::tensor, 4097), (std::vector<std::int64_t>{4096, 4097, 4098, 4099, 4100, 4101, 4102, 4103}));
  // Its pipeline: the same tp and dp on every stage, 640 = TP x DP ranks apart.
  std::vector<std::int64_t> pipeline;
  for (std::int64_t stage = 0; stage < 8; ++stage) pipeline.push_back(1 + 8 * 32 + 640 * stage);
  EXPECT_EQ(seed.members(RankGroupKind::pipeline, 4097), pipeline);
  EXPECT_TRUE(seed.members(RankGroupKind::embedding, 4097).empty());  // stage 6 of 0..7
  EXPECT_EQ(seed.members(RankGroupKind::embedding, 257), (std::vector<std::int64_t>{257, 257 + 640 * 7}));
  const auto data = seed.members(RankGroupKind::data, 4097);
  ASSERT_EQ(data.size(), 80u);
  EXPECT_EQ(data.front(), 1 + 640 * 6);
  EXPECT_EQ(data[1] - data[0], 8);
}

// Megatron's initialize_model_parallel docstring: 16 GPUs, TP 2, PP 4 (so DP 2): tensor groups
// [g0, g1], [g2, g3], ...; pipeline groups [g0, g4, g8, g12], [g1, g5, g9, g13], ...; data groups
// [g0, g2], [g1, g3], [g4, g6], [g5, g7], ...; model-parallel groups as below.
TEST(RankGrid, MegatronsDocumentedSixteenGpuExample) {
  const RankGrid grid(2, 1, 2, 4);
  EXPECT_EQ(grid.members(RankGroupKind::tensor, 3), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(grid.members(RankGroupKind::pipeline, 0), (std::vector<std::int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(grid.members(RankGroupKind::pipeline, 13), (std::vector<std::int64_t>{1, 5, 9, 13}));
  EXPECT_EQ(grid.members(RankGroupKind::data, 1), (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(grid.members(RankGroupKind::data, 6), (std::vector<std::int64_t>{4, 6}));
  // Model-parallel groups [g0, g1, g4, g5, g8, g9, g12, g13], [g2, g3, g6, g7, g10, g11, g14, g15].
  EXPECT_EQ(grid.members(RankGroupKind::model, 5), (std::vector<std::int64_t>{0, 1, 4, 5, 8, 9, 12, 13}));
  EXPECT_EQ(grid.members(RankGroupKind::model, 2), (std::vector<std::int64_t>{2, 3, 6, 7, 10, 11, 14, 15}));
  EXPECT_EQ(grid.members(RankGroupKind::embedding, 1), (std::vector<std::int64_t>{1, 13}));
}

TEST(RankGrid, ContextParallelSitsBetweenTensorAndData) {
  const RankGrid grid(2, 3, 2, 1);
  EXPECT_EQ(grid.coordinates(7), (RankCoordinates{1, 0, 1, 0}));  // 7 = 1 + 2 x (0 + 3 x 1)
  EXPECT_EQ(grid.members(RankGroupKind::context, 7), (std::vector<std::int64_t>{7, 9, 11}));
  EXPECT_EQ(grid.members(RankGroupKind::data, 7), (std::vector<std::int64_t>{1, 7}));
  EXPECT_EQ(grid.members(RankGroupKind::data_context, 7), (std::vector<std::int64_t>{1, 3, 5, 7, 9, 11}));
}

TEST(RankGrid, RefusesSizesBelowOneRanksOutsideTheWorldAndWorldsBeyondMpisInts) {
  EXPECT_THROW(RankGrid(0, 1, 1, 1), std::invalid_argument);
  EXPECT_THROW(RankGrid(1, 1, -2, 1), std::invalid_argument);
  EXPECT_THROW(RankGrid(65536, 1, 65536, 1), std::invalid_argument);
  const RankGrid grid(2, 1, 2, 2);
  EXPECT_THROW((void)grid.coordinates(8), std::out_of_range);
  EXPECT_THROW((void)grid.coordinates(-1), std::out_of_range);
  EXPECT_THROW((void)grid.rank_of({2, 0, 0, 0}), std::out_of_range);
  try {
    (void)grid.coordinates(8);
  } catch (const std::out_of_range& error) {
    EXPECT_NE(std::string(error.what()).find("rank 8 is outside [0, 8)"), std::string::npos) << error.what();
  }
}

TEST(RankGrid, DescribesRankListsCompactly) {
  EXPECT_EQ(describe_ranks({}), "none");
  EXPECT_EQ(describe_ranks({5}), "5");
  EXPECT_EQ(describe_ranks({4096, 4097, 4098, 4099}), "4,096-4,099: 4 ranks");
  EXPECT_EQ(describe_ranks({1, 5, 13}), "1, 5, 13: 3 ranks");
  std::vector<std::int64_t> data;
  for (std::int64_t dp = 0; dp < 80; ++dp) data.push_back(1 + 64 * dp);
  EXPECT_EQ(describe_ranks(data), "1, 65, ..., 5,057: 80 ranks, stride 64");
  const RankGrid seed(8, 1, 80, 8);
  EXPECT_EQ(describe_ranks(seed.members(RankGroupKind::model, 9)),
            "8-15, 648-655, ..., 4,488-4,495: 64 ranks, 8 runs of 8, stride 640");
}

}  // namespace
}  // namespace tandem
