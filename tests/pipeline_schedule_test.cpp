// Megatron's pipeline schedules for one stage (core/pipeline_schedule.hpp).
// Kind of comparison: exact (the order of passes, written out from Megatron's schedule; the
// exchanges run by a model of rendezvous transports).
#include "core/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

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

TEST(PipelineSchedule, InterleavedIsMegatronsTableWarmupSteadyAndCooldown) {
  // 2 stages, 2 chunks, 4 microbatches: Megatron's table in groups of PP = 2 microbatches is
  // (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); stage 0 warms up with (2-0-1) x 2 + (2-1) x 2
  // = 4 forwards, stage 1 with 2; each steady step is a forward and a backward, the backwards
  // taking the table with the chunks reversed.
  EXPECT_EQ(describe(interleaved_one_forward_one_backward(2, 0, 2, 4)),
            "F0.0 F1.0 F0.1 F1.1 F2.0+B0.1 F3.0+B1.1 F2.1+B0.0 F3.1+B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(describe(interleaved_one_forward_one_backward(2, 1, 2, 4)),
            "F0.0 F1.0 F0.1+B0.1 F1.1+B1.1 F2.0+B0.0 F3.0+B1.0 F2.1+B2.1 F3.1+B3.1 B2.0 B3.0");
  // M = PP: the warmup takes every forward on stage 0 (Megatron's are_all_microbatches_in_warmup).
  EXPECT_EQ(describe(interleaved_one_forward_one_backward(2, 0, 2, 2)), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // Megatron's own example in schedules.py (PP 2, VP 2, 5 microbatches, groups of 3) needs a group
  // size other than PP, which tandem does not take; its rule for groups of PP holds instead:
  EXPECT_EQ(interleaved_schedule_problem(2, 5),
            "the interleaved schedule's microbatches per replica (5) must be a multiple of "
            "--pipeline-model-parallel-size (2): the last group would hold 1 (Megatron)");
  EXPECT_EQ(interleaved_schedule_problem(4, 2),
            "the interleaved schedule runs groups of --pipeline-model-parallel-size (4) microbatches; a "
            "replica has 2 (Megatron)");
  EXPECT_EQ(interleaved_schedule_problem(4, 8), "");
  EXPECT_THROW(interleaved_one_forward_one_backward(4, 0, 2, 6), std::invalid_argument);
}

TEST(PipelineSchedule, InterleavedRunsEveryChunkOfEveryMicrobatchOnceEachWayInMicrobatchOrderPerChunk) {
  for (std::int64_t stages = 2; stages <= 5; ++stages) {
    for (std::int64_t chunks = 1; chunks <= 4; ++chunks) {
      for (std::int64_t microbatches = stages; microbatches <= 3 * stages; microbatches += stages) {
        for (std::int64_t stage = 0; stage < stages; ++stage) {
          const auto passes = interleaved_one_forward_one_backward(stages, stage, chunks, microbatches);
          ASSERT_EQ(passes.size(), static_cast<std::size_t>(2 * chunks * microbatches));
          std::map<std::int64_t, std::int64_t> next_forward;   // chunk -> microbatch
          std::map<std::int64_t, std::int64_t> next_backward;  // chunk -> microbatch
          std::set<std::pair<std::int64_t, std::int64_t>> forwarded;
          for (std::size_t i = 0; i < passes.size(); ++i) {
            const PipelinePass& pass = passes[i];
            // Each chunk's forwards and backwards in microbatch order: a parameter's gradient
            // adds its microbatches in the order one stage adds them.
            if (pass.forward) {
              ASSERT_EQ(pass.microbatch, next_forward[pass.chunk]++) << describe(passes);
              if (pass.chunk > 0) {
                ASSERT_TRUE(forwarded.count({pass.microbatch, pass.chunk - 1})) << describe(passes);
              }
              forwarded.insert({pass.microbatch, pass.chunk});
            } else {
              ASSERT_EQ(pass.microbatch, next_backward[pass.chunk]++) << describe(passes);
              ASSERT_TRUE(forwarded.count({pass.microbatch, pass.chunk})) << describe(passes);
            }
            // A step joins a backward to the forward just before it.
            if (pass.joins_previous) {
              ASSERT_TRUE(!pass.forward && i > 0 && passes[i - 1].forward) << describe(passes);
            }
          }
          for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
            ASSERT_EQ(next_forward[chunk], microbatches);
            ASSERT_EQ(next_backward[chunk], microbatches);
          }
        }
      }
    }
  }
}

// Every stage's exchanges run as the ranks make them, with a send complete only once its receiver
// has posted the matching receive (rendezvous, as NCCL and MPI's large messages are; the thread
// mailboxes and MPI's small messages are more forgiving): "" when every exchange completes with
// every message taken by the pass it was meant for, else what went wrong. Messages between two
// stages are matched in the order they are made, whatever they carry (NCCL has no tags).
std::string run_exchanges(const std::vector<std::vector<StageExchange>>& exchanges) {
  const std::size_t stages = exchanges.size();
  std::vector<std::size_t> at(stages, 0);
  std::vector<std::vector<bool>> sent(stages);
  std::vector<std::vector<bool>> received(stages);
  const auto current = [&](std::size_t s) -> const StageExchange* {
    return at[s] < exchanges[s].size() ? &exchanges[s][at[s]] : nullptr;
  };
  const auto post = [&](std::size_t s) {
    if (const StageExchange* exchange = current(s)) {
      sent[s].assign(exchange->sends.size(), false);
      received[s].assign(exchange->receives.size(), false);
    }
  };
  for (std::size_t s = 0; s < stages; ++s) post(s);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < stages; ++s) {
      const StageExchange* exchange = current(s);
      if (exchange == nullptr) continue;
      for (std::size_t k = 0; k < exchange->sends.size(); ++k) {
        const StageMessage& message = exchange->sends[k];
        bool earlier_pending = false;  // to the same peer: it goes first
        for (std::size_t j = 0; j < k; ++j) earlier_pending |= !sent[s][j] && exchange->sends[j].peer == message.peer;
        const auto peer = static_cast<std::size_t>(message.peer);
        const StageExchange* theirs = current(peer);
        if (sent[s][k] || earlier_pending || theirs == nullptr) continue;
        for (std::size_t j = 0; j < theirs->receives.size(); ++j) {
          if (received[peer][j] || theirs->receives[j].peer != static_cast<int>(s)) continue;
          const StageMessage& expected = theirs->receives[j];
          if (std::tie(message.gradient, message.microbatch, message.chunk) !=
              std::tie(expected.gradient, expected.microbatch, expected.chunk)) {
            return "stage " + std::to_string(s) + " sent " + (message.gradient ? "B" : "F") +
                   std::to_string(message.microbatch) + "." + std::to_string(message.chunk) + " where stage " +
                   std::to_string(peer) + " takes " + (expected.gradient ? "B" : "F") +
                   std::to_string(expected.microbatch) + "." + std::to_string(expected.chunk);
          }
          sent[s][k] = received[peer][j] = progress = true;
          break;
        }
      }
    }
    for (std::size_t s = 0; s < stages; ++s) {
      const StageExchange* exchange = current(s);
      if (exchange == nullptr) continue;
      if (std::find(sent[s].begin(), sent[s].end(), false) == sent[s].end() &&
          std::find(received[s].begin(), received[s].end(), false) == received[s].end()) {
        ++at[s];
        post(s);
        progress = true;
      }
    }
  }
  std::string stuck;
  for (std::size_t s = 0; s < stages; ++s) {
    if (current(s) != nullptr) {
      stuck += " stage " + std::to_string(s) + " at exchange " + std::to_string(at[s]) + " of " +
               std::to_string(exchanges[s].size());
    }
  }
  return stuck.empty() ? "" : "deadlock:" + stuck;
}

TEST(PipelineSchedule, EveryScheduleExchangesWithoutDeadlockEachMessageToThePassThatTakesIt) {
  using Schedule = std::function<std::vector<PipelinePass>(std::int64_t stages, std::int64_t stage,
                                                           std::int64_t chunks, std::int64_t microbatches)>;
  const std::vector<std::pair<std::string, Schedule>> schedules = {
      {"1F1B", [](auto stages, auto stage, auto, auto m) { return one_forward_one_backward(stages, stage, m); }},
      {"interleaved 1F1B", [](auto stages, auto stage, auto chunks,
                              auto m) { return interleaved_one_forward_one_backward(stages, stage, chunks, m); }},
      {"one at a time", [](auto, auto, auto chunks, auto m) { return one_microbatch_at_a_time(chunks, m); }},
      {"forward only", [](auto, auto, auto chunks, auto m) { return one_microbatch_at_a_time(chunks, m, true); }},
  };
  for (const auto& [name, schedule] : schedules) {
    for (std::int64_t stages = 2; stages <= 8; ++stages) {
      for (std::int64_t chunks = 1; chunks <= (name == "1F1B" ? 1 : 4); ++chunks) {
        for (std::int64_t microbatches = 1; microbatches <= 3 * stages; ++microbatches) {
          if (name == "interleaved 1F1B" && !interleaved_schedule_problem(stages, microbatches).empty()) continue;
          std::vector<std::vector<StageExchange>> exchanges;
          for (std::int64_t stage = 0; stage < stages; ++stage) {
            const auto passes = schedule(stages, stage, chunks, microbatches);
            exchanges.push_back(stage_exchanges(passes, stages, stage, chunks));
            // Every pass but the first virtual stage's forwards and the last's backwards takes
            // exactly one message, and every pass but the last's forwards and the first's
            // backwards gives one.
            std::size_t takes = 0;
            std::size_t gives = 0;
            for (const StageExchange& exchange : exchanges.back()) {
              takes += exchange.receives.size();
              gives += exchange.sends.size();
            }
            std::size_t expected_takes = 0;
            std::size_t expected_gives = 0;
            for (const PipelinePass& pass : passes) {
              const std::int64_t virtual_stage = pass.chunk * stages + stage;
              expected_takes += pass.forward ? virtual_stage != 0 : virtual_stage != stages * chunks - 1;
              expected_gives += pass.forward ? virtual_stage != stages * chunks - 1 : virtual_stage != 0;
            }
            ASSERT_EQ(takes, expected_takes) << name;
            ASSERT_EQ(gives, expected_gives) << name;
          }
          EXPECT_EQ(run_exchanges(exchanges), "") << name << ", " << stages << " stages x " << chunks << " chunks, "
                                                   << microbatches << " microbatches";
        }
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedPassesExchangedOneAtATimeWouldDeadlock) {
  // Negative control of the model above: the interleaved passes with every pass a step of its own
  // (the 1F1B's exchanges) deadlock on a rendezvous transport, which is why Megatron's interleaved
  // steady state exchanges once per forward-and-backward step.
  std::vector<std::vector<StageExchange>> exchanges;
  for (std::int64_t stage = 0; stage < 4; ++stage) {
    auto passes = interleaved_one_forward_one_backward(4, stage, 2, 8);
    for (PipelinePass& pass : passes) pass.joins_previous = false;
    exchanges.push_back(stage_exchanges(passes, 4, stage, 2));
  }
  EXPECT_TRUE(run_exchanges(exchanges).starts_with("deadlock")) << run_exchanges(exchanges);
}

// Every stage runs its passes in order, each forward taking 1 unit and each backward 2 per chunk,
// a step starting when the stage is free and every message its exchange receives has been sent
// (the sending pass has ended; sends do not wait): the time every stage spends idle, as a
// fraction idle / (stages x span) kept as the integers {idle, stages x span}.
std::pair<std::int64_t, std::int64_t> ideal_idle(std::int64_t stages, std::int64_t chunks,
                                                 const std::vector<std::vector<PipelinePass>>& passes) {
  std::vector<std::vector<StageExchange>> exchanges;
  for (std::int64_t stage = 0; stage < stages; ++stage) {
    exchanges.push_back(stage_exchanges(passes[static_cast<std::size_t>(stage)], stages, stage, chunks));
  }
  // (stage, gradient, microbatch, receiving chunk) -> when its sending pass ended.
  std::map<std::tuple<std::int64_t, bool, std::int64_t, std::int64_t>, std::int64_t> sent_at;
  std::vector<std::size_t> next_pass(static_cast<std::size_t>(stages), 0);
  std::vector<std::size_t> next_exchange(static_cast<std::size_t>(stages), 0);
  std::vector<std::int64_t> clock(static_cast<std::size_t>(stages), 0);
  std::vector<std::int64_t> busy(static_cast<std::size_t>(stages), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::int64_t stage = 0; stage < stages; ++stage) {
      const auto s = static_cast<std::size_t>(stage);
      const auto& mine = passes[s];
      while (next_pass[s] < mine.size()) {
        // The exchange before this pass (if any): its receives must have been sent.
        const auto& stage_exchanges_of = exchanges[s];
        std::int64_t ready = clock[s];
        bool waiting = false;
        if (next_exchange[s] < stage_exchanges_of.size() && stage_exchanges_of[next_exchange[s]].before == next_pass[s]) {
          // Its sends leave when the stage reaches it, whether or not its receives have come.
          for (const StageMessage& message : stage_exchanges_of[next_exchange[s]].sends) {
            sent_at.emplace(std::tuple{static_cast<std::int64_t>(message.peer), message.gradient, message.microbatch,
                                       message.chunk},
                            clock[s]);
          }
          for (const StageMessage& message : stage_exchanges_of[next_exchange[s]].receives) {
            const auto key = std::tuple{stage, message.gradient, message.microbatch, message.chunk};
            if (!sent_at.count(key)) {
              waiting = true;
              break;
            }
            ready = std::max(ready, sent_at[key]);
          }
          if (waiting) break;
          ++next_exchange[s];
        }
        const PipelinePass& pass = mine[next_pass[s]];
        const std::int64_t duration = pass.forward ? 1 : 2;
        clock[s] = ready + duration;
        busy[s] += duration;
        ++next_pass[s];
        progress = true;
      }
      // The exchange after the last pass sends only.
      if (next_pass[s] == mine.size() && next_exchange[s] < exchanges[s].size()) {
        for (const StageMessage& message : exchanges[s][next_exchange[s]].sends) {
          sent_at[{message.peer, message.gradient, message.microbatch, message.chunk}] = clock[s];
        }
        ++next_exchange[s];
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < passes.size(); ++s) {
    EXPECT_EQ(next_pass[s], passes[s].size()) << "stage " << s << " never ran all its passes";
  }
  const std::int64_t span = *std::max_element(clock.begin(), clock.end());
  std::int64_t idle = 0;
  for (std::int64_t stage = 0; stage < stages; ++stage) idle += span - busy[static_cast<std::size_t>(stage)];
  return {idle, stages * span};
}

TEST(PipelineSchedule, WithIdealTimesTheSchedulesLeaveThePlansBubble) {
  // The plan's idle fraction (p - 1) / (v m + p - 1) (docs/PLANNER.md), exactly, when every pass
  // takes its chunk's time and no message takes any: the schedules and their exchange steps add no
  // wait of their own. (The measured timeline of a run: the pipeline_timeline records.)
  for (std::int64_t stages = 2; stages <= 8; ++stages) {
    for (std::int64_t chunks = 1; chunks <= 3; ++chunks) {
      for (std::int64_t microbatches = 1; microbatches <= 3 * stages; ++microbatches) {
        if (chunks > 1 && !interleaved_schedule_problem(stages, microbatches).empty()) continue;
        std::vector<std::vector<PipelinePass>> passes;
        for (std::int64_t stage = 0; stage < stages; ++stage) {
          passes.push_back(chunks == 1 ? one_forward_one_backward(stages, stage, microbatches)
                                       : interleaved_one_forward_one_backward(stages, stage, chunks, microbatches));
        }
        const auto [idle, total] = ideal_idle(stages, chunks, passes);
        // idle / total == (p - 1) / (v m + p - 1), cross-multiplied.
        EXPECT_EQ(idle * (chunks * microbatches + stages - 1), total * (stages - 1))
            << stages << " stages x " << chunks << " chunks, " << microbatches << " microbatches: idle " << idle
            << " of " << total;
      }
    }
  }
  // One microbatch at a time through the chunks (evaluation's order) leaves far more.
  std::vector<std::vector<PipelinePass>> passes(4, one_microbatch_at_a_time(2, 8));
  const auto [idle, total] = ideal_idle(4, 2, passes);
  EXPECT_GT(idle * (2 * 8 + 4 - 1), total * (4 - 1));
}

// Each (microbatch, chunk) keeps its chunk slot from its forward to its backward and no other pair
// takes it meanwhile; the slots used are exactly the most pairs in flight at once: min(p, m) on
// 1F1B's first stage, Megatron's warmup + 1 on the interleaved one's (p v + p - 1 once m holds
// it), against the microbatches in flight x v that a slot per microbatch would hold.
TEST(PipelineSchedule, ChunkSlotsHoldEachPairFromForwardToBackwardAndNoMoreThanAreInFlight) {
  for (std::int64_t stages = 1; stages <= 6; ++stages) {
    for (std::int64_t chunks = 1; chunks <= 4; ++chunks) {
      if (stages == 1 && chunks > 1) continue;
      for (std::int64_t microbatches = stages; microbatches <= 6 * stages; microbatches += stages) {
        for (std::int64_t stage = 0; stage < stages; ++stage) {
          const auto passes = stages == 1  ? one_microbatch_at_a_time(1, microbatches)
                              : chunks == 1 ? one_forward_one_backward(stages, stage, microbatches)
                                            : interleaved_one_forward_one_backward(stages, stage, chunks, microbatches);
          const ChunkSlots slots = chunk_activation_slots(passes);
          ASSERT_EQ(slots.of_pass.size(), passes.size());
          std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> holder;  // slot -> (m, c)
          std::size_t most = 0;
          for (std::size_t i = 0; i < passes.size(); ++i) {
            const PipelinePass& pass = passes[i];
            const std::int64_t slot = slots.of_pass[i];
            ASSERT_TRUE(slot >= 0 && slot < slots.count) << describe(passes);
            if (pass.forward) {
              ASSERT_FALSE(holder.contains(slot)) << "slot " << slot << " taken twice: " << describe(passes);
              holder[slot] = {pass.microbatch, pass.chunk};
              most = std::max(most, holder.size());
            } else {
              ASSERT_EQ(holder[slot], std::make_pair(pass.microbatch, pass.chunk)) << describe(passes);
              holder.erase(slot);
            }
          }
          ASSERT_TRUE(holder.empty());
          EXPECT_EQ(slots.count, static_cast<std::int64_t>(most)) << describe(passes);
          EXPECT_LE(slots.count, chunks * microbatches_in_flight(passes));
          if (stage == 0 && stages > 1) {
            const std::int64_t warmup = chunks == 1 ? stages - 1 : (stages - 1) * 2 + (chunks - 1) * stages;
            EXPECT_EQ(slots.count, std::min(warmup + 1, chunks * microbatches))
                << stages << " stages x " << chunks << " chunks, " << microbatches << " microbatches";
          }
        }
      }
    }
  }
  // Past 4 p microbatches the counts stay those of 4 p (the planner counts no further).
  for (std::int64_t stages = 2; stages <= 8; ++stages) {
    for (std::int64_t chunks = 1; chunks <= 3; ++chunks) {
      for (std::int64_t stage = 0; stage < stages; ++stage) {
        auto schedule = [&](std::int64_t microbatches) {
          return chunks == 1 ? one_forward_one_backward(stages, stage, microbatches)
                             : interleaved_one_forward_one_backward(stages, stage, chunks, microbatches);
        };
        const auto at_four = schedule(4 * stages);
        for (std::int64_t microbatches = 5 * stages; microbatches <= 9 * stages; microbatches += stages) {
          EXPECT_EQ(chunk_activation_slots(schedule(microbatches)).count, chunk_activation_slots(at_four).count);
          EXPECT_EQ(microbatches_in_flight(schedule(microbatches)), microbatches_in_flight(at_four));
        }
      }
    }
  }
  // Interleaved, 4 stages x 2 chunks, 16 microbatches: the first stage holds 4 x 2 + 3 = 11 pairs,
  // where 8 microbatches are in flight (16 pairs' worth of a slot per microbatch).
  const auto interleaved = interleaved_one_forward_one_backward(4, 0, 2, 16);
  EXPECT_EQ(chunk_activation_slots(interleaved).count, 11);
  EXPECT_EQ(microbatches_in_flight(interleaved), 8);
  // Forward only (evaluation): a pair's slot is free once its forward is done.
  EXPECT_EQ(chunk_activation_slots(one_microbatch_at_a_time(3, 5, true)).count, 1);
}

}  // namespace
}  // namespace tandem::production
