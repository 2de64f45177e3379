// Megatron's pipeline schedules for one stage (production/pipeline_schedule.hpp).
// Kind of comparison: exact (the order of passes, written out from Megatron's schedule).
#include "production/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <set>

namespace tandem::production {
namespace {

TEST(PipelineSchedule, OneForwardOneBackwardIsMegatronsWarmupSteadyAndCooldown) {
  // 4 stages, 6 microbatches: stage s warms up with 3 - s forwards (Megatron's
  // num_warmup_microbatches = PP - rank - 1), the last stage alternates from the start.
  EXPECT_EQ(describe(one_forward_one_backward(4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(describe(one_forward_one_backward(4, 2, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(describe(one_forward_one_backward(4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer microbatches than stages: all forwards, then all backwards.
  EXPECT_EQ(describe(one_forward_one_backward(4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(describe(one_forward_one_backward(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
}

TEST(PipelineSchedule, EveryMicrobatchOnceForwardThenBackwardAndTheBackwardsInOrder) {
  for (std::int64_t stages = 1; stages <= 5; ++stages) {
    for (std::int64_t stage = 0; stage < stages; ++stage) {
      for (std::int64_t microbatches = 1; microbatches <= 9; ++microbatches) {
        const auto passes = one_forward_one_backward(stages, stage, microbatches);
        ASSERT_EQ(passes.size(), static_cast<std::size_t>(2 * microbatches));
        std::set<std::int64_t> forwarded;
        std::int64_t next_backward = 0;
        for (const PipelinePass& pass : passes) {
          if (pass.forward) {
            ASSERT_EQ(pass.microbatch, static_cast<std::int64_t>(forwarded.size()));  // forwards in order
            forwarded.insert(pass.microbatch);
          } else {
            ASSERT_EQ(pass.microbatch, next_backward++);  // backwards in order: the same gradient sums
            ASSERT_TRUE(forwarded.count(pass.microbatch));
          }
        }
        // The first stage holds min(PP, M) microbatches at once (the plan's 1F1B memory), stage s
        // min(PP - s, M).
        EXPECT_EQ(microbatches_in_flight(passes), std::min(stages - stage, microbatches))
            << "stage " << stage << " of " << stages << ", " << microbatches << " microbatches";
      }
    }
  }
}

TEST(PipelineSchedule, OneMicrobatchAtATimeRunsEachThroughTheChunksAndBack) {
  EXPECT_EQ(describe(one_microbatch_at_a_time(2, 2)), "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0");
  EXPECT_EQ(describe(one_microbatch_at_a_time(2, 2, true)), "F0.0 F0.1 F1.0 F1.1");
  EXPECT_EQ(microbatches_in_flight(one_microbatch_at_a_time(3, 4)), 1);
}

}  // namespace
}  // namespace tandem::production
