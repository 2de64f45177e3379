// Data parallelism in the production trainer (production/trainer.hpp, sharding.hpp,
// collectives/): the shard arithmetic, the thread-group collectives' byte moves, and DP ranks of
// the cpu backend run as threads of this process (the same trainer code mpirun runs; the
// binary's MPI runs are tests/production_cli_test.cpp's).
//
// Kinds of comparison:
//   - exact: shard bounds, exchanged integers, counters, the first update's loss across DP sizes;
//   - deterministic (bitwise): distributed vs replicated optimizer, run to run, resume.
// How close a DP run sits to the reference is the equivalence harness's (derived bounds).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/main_state.hpp"
#include "core/checkpoint/manifest.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/model_layout.hpp"
#include "equivalence/tolerance.hpp"
#include "production/checkpointing.hpp"
#include "production/collectives/mpi.hpp"
#include "production/collectives/staged.hpp"
#include "production/collectives/thread_group.hpp"
#include "production/local_ranks.hpp"
#include "production/sharding.hpp"
#include "production/trainer.hpp"
#include "tests/support/files.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace tandem {
namespace {

using production::FlatShards;
using production::HostState;
using production::Trainer;

TEST(FlatShards, OneBucketGivesEachRankOneAlignedSliceAndTheLastMayBeShortOrEmpty) {
  // 5000 elements over 4 ranks: 1250 per rank rounds up to 2 blocks of 1024.
  const FlatShards shards = production::make_flat_shards(5000, 4, 1024);
  ASSERT_EQ(shards.buckets.size(), 1u);
  EXPECT_EQ(shards.slice(0), 2 * 1024);
  EXPECT_EQ(shards.padded(), 4 * 2048);
  EXPECT_EQ(shards.rank_elements(), 2048);
  const std::vector<std::vector<FlatRange>> owned = {{{0, 2048}}, {{2048, 2048}}, {{4096, 5000 - 4096}}, {}};
  for (std::int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(shards.owned(rank), owned[static_cast<std::size_t>(rank)]) << "rank " << rank;
    EXPECT_EQ(shards.slice_begin(0, rank), 2048 * rank);
  }
  EXPECT_EQ(shards.owner(4999), 2);
  EXPECT_EQ(shards.owner(2048), 1);
  EXPECT_EQ(shards.owner(8191), 3);  // padding has an owner too
  EXPECT_THROW(shards.owner(8192), std::out_of_range);
  // One rank holds everything; an empty model still has one (empty) aligned bucket.
  EXPECT_EQ(production::make_flat_shards(5000, 1, 1024).slice(0), 5 * 1024);
  EXPECT_TRUE(production::make_flat_shards(0, 2, 1024).owned(0).empty());
  EXPECT_EQ(production::make_flat_shards(0, 2, 1024).padded(), 2048);
  EXPECT_THROW(production::make_flat_shards(10, 0, 1024), std::invalid_argument);
}

TEST(FlatShards, BucketsAreRoundedToRanksTimesTheAlignmentAndEachRankOwnsASliceOfEach) {
  // 10,000 elements, 2 ranks, buckets of 3000 -> 4096 (2 x 2048); the last holds the rest:
  // [0, 4096), [4096, 8192), [8192, 10240) padded from 10,000.
  const FlatShards shards = production::make_flat_shards(10000, 2, 1024, 3000);
  ASSERT_EQ(shards.buckets.size(), 3u);
  EXPECT_EQ(shards.buckets[0].begin, 0);
  EXPECT_EQ(shards.buckets[1].begin, 4096);
  EXPECT_EQ(shards.buckets[2].begin, 8192);
  EXPECT_EQ(shards.buckets[2].elements, 2048);
  EXPECT_EQ(shards.padded(), 10240);
  EXPECT_EQ(shards.rank_elements(), 5120);
  // Rank 0: [0, 2048), [4096, 6144), [8192, 9216); rank 1 the other halves, its last cut at N.
  EXPECT_EQ(shards.owned(0), (std::vector<FlatRange>{{0, 2048}, {4096, 2048}, {8192, 1024}}));
  EXPECT_EQ(shards.owned(1), (std::vector<FlatRange>{{2048, 2048}, {6144, 2048}, {9216, 10000 - 9216}}));
  EXPECT_EQ(shards.owner(2047), 0);
  EXPECT_EQ(shards.owner(2048), 1);
  EXPECT_EQ(shards.owner(4096), 0);
  EXPECT_EQ(shards.owner(9999), 1);
  EXPECT_EQ(shards.bucket_of(8191), 1u);
  // A bucket size below ranks x alignment is one unit; the buckets always tile [0, padded()).
  const FlatShards small = production::make_flat_shards(5000, 2, 1024, 1);
  EXPECT_EQ(small.buckets.size(), 3u);
  std::int64_t next = 0;
  for (const auto& bucket : small.buckets) {
    EXPECT_EQ(bucket.begin, next);
    EXPECT_EQ(bucket.elements % 2048, 0);
    next += bucket.elements;
  }
  EXPECT_EQ(next, small.padded());
  // Megatron's default bucket size, taken only with --overlap-grad-reduce.
  ParallelConfig parallel;
  parallel.data_parallel = 80;
  EXPECT_EQ(gradient_bucket_parameters(parallel), 0);
  parallel.overlap_grad_reduce = true;
  EXPECT_EQ(gradient_bucket_parameters(parallel), 80'000'000);
  parallel.data_parallel = 8;
  EXPECT_EQ(gradient_bucket_parameters(parallel), 40'000'000);
  parallel.ddp_bucket_size = 1234;
  EXPECT_EQ(gradient_bucket_parameters(parallel), 1234);
}

TEST(FlatShards, DecaySegmentsAreCutAtTheRangeAndMadeRelative) {
  using production::DecaySegment;
  const std::vector<DecaySegment> segments = {{0, 10, true}, {10, 5, false}, {15, 20, true}};
  const std::vector<DecaySegment> cut = production::segments_in_range(segments, 8, 12);  // [8, 20)
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut[0].begin, 0);
  EXPECT_EQ(cut[0].count, 2);  // [8, 10)
  EXPECT_TRUE(cut[0].decay);
  EXPECT_EQ(cut[1].begin, 2);
  EXPECT_EQ(cut[1].count, 5);  // [10, 15)
  EXPECT_FALSE(cut[1].decay);
  EXPECT_EQ(cut[2].begin, 7);
  EXPECT_EQ(cut[2].count, 5);  // [15, 20)
  EXPECT_TRUE(production::segments_in_range(segments, 35, 0).empty());
}

// tandem train initializes MPI only when a launcher's variables say it started this process.
TEST(MpiLauncher, IsRecognizedByOpenMpiPmixOrPmiVariablesAndOnlyThen) {
  const std::vector<std::string> names = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"};
  std::vector<std::optional<std::string>> saved;
  for (const auto& name : names) {
    const char* value = std::getenv(name.c_str());
    saved.push_back(value ? std::optional<std::string>(value) : std::nullopt);
    ::unsetenv(name.c_str());
  }
  EXPECT_FALSE(production::launched_by_mpi_launcher());
  for (const auto& name : names) {
    ::setenv(name.c_str(), "0", 1);
    EXPECT_TRUE(production::launched_by_mpi_launcher()) << name;
    ::unsetenv(name.c_str());
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (saved[i]) ::setenv(names[i].c_str(), saved[i]->c_str(), 1);
  }
}

// Every exchange of `collectives` (rank `rank` of kRanks) moves exactly the documented bytes.
constexpr int kRanks = 3;
void exchange_documented_bytes(production::Collectives& collectives, int rank) {
  constexpr std::int64_t kChunk = 2;
  // send_receive, every ring step: rank r sends 100 r + 10 step + i to rank r + step and
  // receives from rank r - step.
  for (int step = 1; step < kRanks; ++step) {
    const int to = (rank + step) % kRanks;
    const int from = (rank - step + kRanks) % kRanks;
    std::vector<float> sent(kChunk);
    for (int i = 0; i < kChunk; ++i) sent[static_cast<std::size_t>(i)] = static_cast<float>(100 * rank + 10 * step + i);
    std::vector<float> received(kChunk, -1.0f);
    collectives.send_receive(sent.data(), to, received.data(), from, kChunk);
    for (int i = 0; i < kChunk; ++i) {
      if (received[static_cast<std::size_t>(i)] != static_cast<float>(100 * from + 10 * step + i)) {
        throw std::runtime_error("send_receive: rank " + std::to_string(rank) + " got a wrong value from " +
                                 std::to_string(from) + " in step " + std::to_string(step));
      }
    }
  }
  // all_gather_in_place: every rank fills only its part.
  std::vector<std::int32_t> parts(kRanks, -1);
  parts[static_cast<std::size_t>(rank)] = 7 * rank;
  collectives.all_gather_in_place(parts.data(), sizeof(std::int32_t));
  for (int r = 0; r < kRanks; ++r) {
    if (parts[static_cast<std::size_t>(r)] != 7 * r) throw std::runtime_error("all_gather_in_place: wrong part");
  }
  // Exchanges of nothing are allowed (a null pointer with no bytes, as an empty vector has).
  collectives.all_gather_host(nullptr, nullptr, 0);
  collectives.send_receive(nullptr, (rank + 1) % kRanks, nullptr, (rank + kRanks - 1) % kRanks, 0);
  const std::vector<double> mine = {static_cast<double>(rank), 0.5};
  const std::vector<double> all = production::all_gather_values(collectives, mine);
  for (int r = 0; r < kRanks; ++r) {
    if (all[static_cast<std::size_t>(2 * r)] != r || all[static_cast<std::size_t>(2 * r + 1)] != 0.5) {
      throw std::runtime_error("all_gather_host: wrong values");
    }
  }
}

TEST(ThreadGroup, ExchangesMoveExactlyTheDocumentedBytes) {
  const auto group = production::make_thread_group(kRanks);
  production::run_thread_group(group, [&](int rank) {
    exchange_documented_bytes(*group[static_cast<std::size_t>(rank)], rank);
  });
}

// The cuda backend's transport for ranks that share a device (collectives/staged.hpp), here over
// the host backend and a thread group: the same bytes as the host collectives underneath.
TEST(HostStagedCollectives, MoveExactlyTheBytesOfTheHostCollectivesUnderneath) {
  const auto group = production::make_thread_group(kRanks);
  production::run_thread_group(group, [&](int rank) {
    auto backend = production::make_host_backend();
    const auto staged = production::make_host_staged_collectives(*backend, group[static_cast<std::size_t>(rank)]);
    if (staged->callable_from_other_threads()) throw std::runtime_error("a lane's worker must not call it");
    exchange_documented_bytes(*staged, rank);
  });
}

TEST(ThreadGroup, AFailingRankReleasesTheOthersAndItsErrorIsRethrown) {
  const auto group = production::make_thread_group(3);
  try {
    production::run_thread_group(group, [&](int rank) {
      if (rank == 1) throw std::runtime_error("rank 1 failed on purpose");
      group[static_cast<std::size_t>(rank)]->barrier();  // would wait forever for rank 1
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "rank 1 failed on purpose");
  }
}

// The tiny model (2 layers, d 32, 4 heads in 2 groups, seq 32), mbs 1, the global batch `gbs`.
RunConfig tiny_run(std::int64_t ranks, std::int64_t gbs, bool bf16, bool distributed) {
  RunConfig config = testing::tiny_data_parallel_run(ranks, gbs);
  config.parallel.use_distributed_optimizer = distributed;
  config.optimizer.adam_beta2 = 0.95;
  config.optimizer.clip_grad = 0.5;  // active on this model's first updates
  config.optimizer.bf16 = bf16;
  config.schedule.lr = 1e-3;
  config.schedule.lr_warmup_init = 1e-4;
  config.schedule.lr_warmup_samples = gbs;
  config.schedule.lr_decay_style = LrDecayStyle::cosine;
  config.schedule.weight_decay = 0.1;
  config.schedule.start_weight_decay = 0.1;
  config.schedule.end_weight_decay = 0.1;
  config.schedule.wd_incr_samples = 8 * gbs;
  return config;
}

// DP ranks as threads (production/local_ranks.hpp): one Trainer per rank, every call made on every
// rank together.
class Ranks {
 public:
  explicit Ranks(const RunConfig& config, const production::FaultSchedule& faults = {},
                 const production::ProductionMutants& mutants = {})
      : ranks_(config, testing::tiny_production_samples(), options(faults, mutants),
               production::LocalRanks::Transport::threads) {}
  // Every rank's record of one iteration.
  std::vector<IterationRecord> run_iteration() {
    std::vector<IterationRecord> records(ranks_.size());
    ranks_.each([&](Trainer& trainer, int rank) { records[static_cast<std::size_t>(rank)] = trainer.run_iteration(); });
    return records;
  }
  HostState state() {
    std::vector<HostState> states(ranks_.size());
    ranks_.each([&](Trainer& trainer, int rank) { states[static_cast<std::size_t>(rank)] = trainer.host_state(); });
    return states.front();
  }
  void restore(const HostState& state) {
    ranks_.each([&](Trainer& trainer, int) { trainer.restore(state); });
  }
  // save_trainer_checkpoint on every rank; `hooks` for rank r (tests of a failing rank). Returns
  // every rank's error message ("" when it returned).
  std::vector<std::string> save(const std::filesystem::path& dir, int failing_rank = -1,
                                const checkpoint::SaveHooks& hooks = {}) {
    std::vector<std::string> errors(ranks_.size());
    ranks_.each([&](Trainer& trainer, int rank) {
      try {
        production::save_trainer_checkpoint(trainer, dir, rank == failing_rank ? hooks : checkpoint::SaveHooks{});
      } catch (const std::exception& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
      }
    });
    return errors;
  }
  void resume(const std::filesystem::path& dir) {
    ranks_.each([&](Trainer& trainer, int) { production::resume_trainer_from(trainer, dir); });
  }
  void each(const std::function<void(Trainer&, int)>& body) { ranks_.each(body); }
  void audit(const std::vector<std::int64_t>& elements) {
    for (std::size_t r = 0; r < ranks_.size(); ++r) ranks_.at(r).set_audit_elements(elements);
  }
  Trainer& rank(int r) { return ranks_.at(static_cast<std::size_t>(r)); }

 private:
  static production::ProductionOptions options(const production::FaultSchedule& faults,
                                               const production::ProductionMutants& mutants) {
    production::ProductionOptions out;
    out.device = production::Device::cpu;
    out.hooks = production::make_test_hooks(faults, mutants);
    return out;
  }
  production::LocalRanks ranks_;
};

// Bitwise equality of two records' numbers and counters (timings excluded).
void expect_same_record(const IterationRecord& a, const IterationRecord& b, const std::string& what) {
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.loss), std::bit_cast<std::uint64_t>(b.loss)) << what << " loss";
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.grad_norm), std::bit_cast<std::uint64_t>(b.grad_norm)) << what << " grad_norm";
  EXPECT_EQ(a.clip_coeff, b.clip_coeff) << what;
  EXPECT_EQ(a.clipped, b.clipped) << what;
  EXPECT_EQ(a.update_successful, b.update_successful) << what;
  EXPECT_EQ(a.lr, b.lr) << what;
  EXPECT_EQ(a.totals.consumed_samples, b.totals.consumed_samples) << what;
  EXPECT_EQ(a.totals.loss_tokens, b.totals.loss_tokens) << what;
  EXPECT_EQ(a.totals.input_tokens, b.totals.input_tokens) << what;
  EXPECT_EQ(a.model_flops, b.model_flops) << what;
}

void expect_same_state(const HostState& a, const HostState& b, const std::string& what) {
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    differing += std::bit_cast<std::uint32_t>(a.params[i]) != std::bit_cast<std::uint32_t>(b.params[i]);
    differing += std::bit_cast<std::uint32_t>(a.exp_avg[i]) != std::bit_cast<std::uint32_t>(b.exp_avg[i]);
    differing += std::bit_cast<std::uint32_t>(a.exp_avg_sq[i]) != std::bit_cast<std::uint32_t>(b.exp_avg_sq[i]);
  }
  EXPECT_EQ(differing, 0) << what << ": elements of params, m, v that differ in any bit";
  EXPECT_EQ(a.counters.successful_updates, b.counters.successful_updates) << what;
  EXPECT_EQ(a.counters.consumed_samples, b.counters.consumed_samples) << what;
}

TEST(DataParallel, EveryRankReportsTheSameRecordAndTheDistributedOptimizerEqualsTheReplicated) {
  for (const bool bf16 : {false, true}) {
    for (const std::int64_t ranks : {2, 3, 4}) {
      const std::string what = std::to_string(ranks) + " ranks" + (bf16 ? " bf16" : " fp32");
      Ranks replicated(tiny_run(ranks, 2 * ranks, bf16, false));
      Ranks distributed(tiny_run(ranks, 2 * ranks, bf16, true));
      ASSERT_TRUE(distributed.rank(0).distributed_optimizer());
      ASSERT_FALSE(replicated.rank(0).distributed_optimizer());
      // Audited elements on every shard, including the last parameter.
      const std::int64_t n = replicated.rank(0).layout().total_elements;
      const std::vector<std::int64_t> audited = {0, n / 3, n / 2, n - 1};
      replicated.audit(audited);
      distributed.audit(audited);
      bool clipped = false;
      for (int iteration = 1; iteration <= 3; ++iteration) {
        const auto a = replicated.run_iteration();
        const auto b = distributed.run_iteration();
        for (std::size_t r = 1; r < a.size(); ++r) expect_same_record(a[0], a[r], what + " rank " + std::to_string(r));
        expect_same_record(a[0], b[0], what + " replicated vs distributed");
        ASSERT_EQ(a[0].audit.size(), audited.size());
        for (std::size_t i = 0; i < audited.size(); ++i) {
          EXPECT_EQ(a[0].audit[i].new_value, b[0].audit[i].new_value) << what << " audit " << i;
          EXPECT_EQ(a[0].audit[i].grad, b[0].audit[i].grad) << what << " audit " << i;
          EXPECT_EQ(a[0].audit[i].old_v, b[0].audit[i].old_v) << what << " audit " << i;
        }
        clipped = clipped || a[0].clipped;
      }
      EXPECT_TRUE(clipped) << what << ": the clip path was not exercised";
      const HostState state = distributed.state();
      expect_same_state(replicated.state(), state, what);
      // The audit's new value is the element the gathered state holds.
      const auto last = distributed.run_iteration();
      const HostState after = distributed.state();
      for (std::size_t i = 0; i < audited.size(); ++i) {
        EXPECT_EQ(last[0].audit[i].new_value, after.params[static_cast<std::size_t>(audited[i])]) << what;
      }
    }
  }
}

// Megatron's overlap options and the bucket size are throughput options: the exchanges and the
// sums are the same, in the same order (each element's DP contributions added in rank order,
// whichever rank owns it), so every record, audit entry, evaluation and state is bitwise that of
// the run with one bucket and no overlap; the thread-group ranks run the lane on a worker thread,
// so the overlapped exchanges really run beside the compute.
TEST(DataParallel, OverlapAndBucketSizeChangeNoBit) {
  struct Variant {
    const char* name;
    bool grad_reduce;
    bool param_gather;
    std::int64_t bucket;
  };
  const std::vector<Variant> variants = {{"buckets of 1 (one unit each), overlap-grad-reduce", true, false, 1},
                                         {"buckets of 5000, overlap-grad-reduce", true, false, 5000},
                                         {"Megatron's default bucket, overlap-grad-reduce", true, false, 0},
                                         {"buckets of 1, both overlaps", true, true, 1}};
  for (const bool bf16 : {false, true}) {
    for (const std::int64_t ranks : {2, 3}) {
      for (const bool distributed : {false, true}) {
        const std::string what = std::to_string(ranks) + " ranks" + (bf16 ? " bf16" : " fp32") +
                                 (distributed ? " distributed" : " replicated");
        const RunConfig base = tiny_run(ranks, 2 * ranks, bf16, distributed);
        Ranks plain(base);
        const std::int64_t n = plain.rank(0).layout().total_elements;
        const std::vector<std::int64_t> audited = {0, n / 3, n / 2, n - 1};
        plain.audit(audited);
        std::vector<std::vector<IterationRecord>> expected;
        for (int iteration = 0; iteration < 3; ++iteration) expected.push_back(plain.run_iteration());
        const HostState expected_state = plain.state();
        for (const Variant& variant : variants) {
          if (variant.param_gather && !distributed) continue;  // Megatron: distributed optimizer only
          const std::string case_name = what + ", " + variant.name;
          RunConfig config = base;
          config.parallel.overlap_grad_reduce = variant.grad_reduce;
          config.parallel.overlap_param_gather = variant.param_gather;
          config.parallel.ddp_bucket_size = variant.bucket;
          Ranks overlapped(config);
          ASSERT_TRUE(overlapped.rank(0).overlaps_grad_reduce()) << case_name;
          EXPECT_EQ(overlapped.rank(0).overlaps_param_gather(), variant.param_gather) << case_name;
          EXPECT_STREQ(overlapped.rank(0).lane_description(), "worker thread") << case_name;
          if (variant.bucket == 1) {
            EXPECT_GE(overlapped.rank(0).shards().buckets.size(), 3u) << case_name << ": too few buckets to test";
          }
          overlapped.audit(audited);
          for (int iteration = 0; iteration < 3; ++iteration) {
            const auto records = overlapped.run_iteration();
            for (std::size_t r = 0; r < records.size(); ++r) {
              const std::string where = case_name + ", iteration " + std::to_string(iteration + 1) + ", rank " + std::to_string(r);
              expect_same_record(expected[static_cast<std::size_t>(iteration)][r], records[r], where);
              for (std::size_t i = 0; i < audited.size(); ++i) {
                EXPECT_EQ(expected[static_cast<std::size_t>(iteration)][r].audit[i].new_value, records[r].audit[i].new_value)
                    << where << " audit " << i;
              }
            }
          }
          expect_same_state(expected_state, overlapped.state(), case_name);
        }
      }
    }
  }
}

// With --overlap-param-gather the all-gather of the updated weights waits for the next forward;
// an evaluation between two iterations must gather them first (it reads every weight).
TEST(DataParallel, AnEvaluationAfterADeferredWeightGatherSeesTheUpdatedWeights) {
  RunConfig config = tiny_run(2, 4, true, true);
  Ranks plain(config);
  config.parallel.overlap_grad_reduce = true;
  config.parallel.overlap_param_gather = true;
  config.parallel.ddp_bucket_size = 1;
  Ranks overlapped(config);
  const production::SampleProvider validation = testing::tiny_production_samples();
  for (Ranks* ranks : {&plain, &overlapped}) ranks->run_iteration();
  std::vector<EvaluationRecord> evaluations(2);
  for (int which = 0; which < 2; ++which) {
    Ranks& ranks = which == 0 ? plain : overlapped;
    std::vector<EvaluationRecord> records(2);
    ranks.each([&](Trainer& trainer, int rank) { records[static_cast<std::size_t>(rank)] = trainer.evaluate(validation, 2); });
    evaluations[static_cast<std::size_t>(which)] = records[0];
  }
  EXPECT_EQ(std::bit_cast<std::uint64_t>(evaluations[0].loss), std::bit_cast<std::uint64_t>(evaluations[1].loss));
  // And training continues from the same weights.
  expect_same_record(plain.run_iteration()[0], overlapped.run_iteration()[0], "the iteration after the evaluation");
}

TEST(DataParallel, RunsAreBitwiseReproducible) {
  HostState first;
  for (int run = 0; run < 2; ++run) {
    Ranks ranks(tiny_run(4, 8, true, true));
    for (int iteration = 0; iteration < 3; ++iteration) ranks.run_iteration();
    if (run == 0) {
      first = ranks.state();
    } else {
      expect_same_state(first, ranks.state(), "second run");
    }
  }
}

// The first update's loss: every microbatch's rows are summed in order and the microbatches in
// global order (m, then rank), which is the one-rank order of the same samples.
TEST(DataParallel, TheLoggedLossAndCountsDoNotDependOnTheDataParallelSize) {
  std::vector<IterationRecord> firsts;
  std::vector<float> one_rank_gradient;  // [N] the one-rank run's reduced gradient
  for (const std::int64_t ranks : {1, 2, 4}) {
    Ranks run(tiny_run(ranks, 8, false, true));
    if (ranks == 1) run.rank(0).keep_last_gradient(true);  // a collective switch: one rank here
    firsts.push_back(run.run_iteration().front());
    if (ranks == 1) one_rank_gradient = run.rank(0).last_gradient();
  }
  // Approximate: the gradients are the same fp32 sums in another order, so the norms differ by at
  // most the harness's norm bound for two fp32 evaluations (equivalence/tolerance.hpp).
  const RunConfig config = tiny_run(1, 8, false, true);
  double max_abs_gradient = 0.0;
  for (const float g : one_rank_gradient) max_abs_gradient = std::max(max_abs_gradient, std::abs(static_cast<double>(g)));
  const equivalence::PrecisionPair fp32_pair{equivalence::fp32(), equivalence::fp32()};
  const equivalence::ReductionShape shape = equivalence::reduction_shape(config);
  const double norm_bound = equivalence::norm_bound(
      shape, fp32_pair, equivalence::gradient_bound(shape, fp32_pair, max_abs_gradient), firsts[0].grad_norm);
  for (std::size_t i = 1; i < firsts.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(firsts[0].loss), std::bit_cast<std::uint64_t>(firsts[i].loss)) << i;
    EXPECT_EQ(firsts[0].input_tokens, firsts[i].input_tokens);
    EXPECT_EQ(firsts[0].loss_tokens, firsts[i].loss_tokens);
    EXPECT_EQ(firsts[0].model_flops, firsts[i].model_flops);
    EXPECT_LE(std::abs(firsts[0].grad_norm - firsts[i].grad_norm), norm_bound) << i;
  }
}

// SPEC 7 under --bf16: bf16 compute, but the weight gradients accumulate over microbatches in
// fp32. With one microbatch per rank, R ranks compute the global batch's R microbatch gradients
// (each from zero) and the reduction adds them in rank order in fp32; one rank running the same R
// microbatches must hold the same bits for every element that gets one contribution per
// microbatch: the linear weights, one accumulating GEMM each (norm weights and embedding rows add
// row by row, so their sums are grouped otherwise, and are left out). Comparison: exact. A main
// gradient kept in bf16 between microbatches (2^-9 relative per rounding) is far inside the
// harness's worst-case bf16 bounds: this is the test that sees it (negative control below).
TEST(DataParallel, Bf16MicrobatchGradientsAccumulateInFp32AsTheRanksSumThemBitwise) {
  const ModelLayout layout = make_model_layout(tiny_run(1, 2, true, true).model);
  std::vector<FlatRange> linear;  // the linear weights' flat ranges
  for (const LayerTensorIndices& layer : layout.layers) {
    for (const std::int64_t index : {layer.q_weight, layer.k_weight, layer.v_weight, layer.o_weight,
                                     layer.gate_weight, layer.up_weight, layer.down_weight}) {
      linear.push_back({layout.tensor(index).offset, layout.tensor(index).numel});
    }
  }
  ASSERT_NE(layout.output, layout.embedding);  // untied: lm_head is one GEMM per microbatch too
  linear.push_back({layout.tensor(layout.output).offset, layout.tensor(layout.output).numel});
  // The first update's reduced, pre-clip gradient of a run on `ranks` ranks with GBS `gbs` (mbs 1).
  const auto first_gradient = [](std::int64_t ranks, std::int64_t gbs, const production::ProductionMutants& mutants) {
    Ranks run(tiny_run(ranks, gbs, /*bf16=*/true, /*distributed=*/true), {}, mutants);
    run.each([](Trainer& trainer, int) { trainer.keep_last_gradient(true); });  // collective: every rank
    run.run_iteration();
    return run.rank(0).last_gradient();
  };
  // Elements of the linear weights whose bits differ, and the first of them.
  const auto differing = [&](const std::vector<float>& a, const std::vector<float>& b, std::string& first) {
    std::int64_t count = 0;
    for (const FlatRange& range : linear) {
      for (std::int64_t e = range.begin; e < range.begin + range.count; ++e) {
        const auto i = static_cast<std::size_t>(e);
        if (std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i])) continue;
        if (count++ == 0) {
          std::ostringstream text;
          text.precision(9);
          text << "flat element " << e << ": " << a[i] << " against " << b[i];
          first = text.str();
        }
      }
    }
    return count;
  };
  for (const std::int64_t microbatches : {2, 4}) {
    const std::vector<float> summed_by_ranks = first_gradient(microbatches, microbatches, {});
    const std::vector<float> accumulated = first_gradient(1, microbatches, {});
    ASSERT_EQ(accumulated.size(), static_cast<std::size_t>(layout.total_elements));
    ASSERT_EQ(summed_by_ranks.size(), accumulated.size());
    std::string first;
    EXPECT_EQ(differing(accumulated, summed_by_ranks, first), 0)
        << microbatches << " microbatches on one rank against " << microbatches << " ranks: " << first;
    // Negative control: the main gradients rounded to bf16 between microbatches are rejected.
    production::ProductionMutants bf16_main_gradients;
    bf16_main_gradients.bf16_main_gradients_between_microbatches = true;
    const std::vector<float> mutant = first_gradient(1, microbatches, bf16_main_gradients);
    const std::int64_t caught = differing(mutant, summed_by_ranks, first);
    EXPECT_GT(caught, 0) << microbatches << " microbatches: the bf16 main gradient was not seen";
    std::cout << microbatches << " microbatches: the bf16 main gradient changes " << caught
              << " linear-weight gradient elements (first: " << first << ")\n";
  }
}

TEST(DataParallel, ResumeIsBitExactAndAStateMovesToAnotherDataParallelSize) {
  const RunConfig config = tiny_run(2, 4, true, true);
  Ranks straight(config);
  for (int iteration = 0; iteration < 4; ++iteration) straight.run_iteration();

  Ranks before(config);
  before.run_iteration();
  const HostState saved = before.state();
  Ranks resumed(config);
  resumed.restore(saved);
  expect_same_state(saved, resumed.state(), "restored");
  for (int iteration = 0; iteration < 3; ++iteration) resumed.run_iteration();
  expect_same_state(straight.state(), resumed.state(), "2 ranks: 1 + resume + 3 vs 4 straight");

  // The checkpoint's state is whole, so 4 ranks (or one) take it up and hold exactly it.
  Ranks wider(tiny_run(4, 4, true, true));
  wider.restore(saved);
  expect_same_state(saved, wider.state(), "restored on 4 ranks");
  EXPECT_TRUE(wider.run_iteration().front().update_successful);
}

// Format 3: each rank writes its shard; the shards hold exactly the gathered state; a resume on the
// same ranks is bit-exact, and 1, 3 or 4 ranks (other shard boundaries) take the state up exactly.
TEST(DataParallel, EachRankWritesItsShardAndAnyDataParallelSizeResumesFromIt) {
  for (const bool distributed : {true, false}) {
    for (const std::int64_t size : {2, 3}) {
      const std::string what = std::to_string(size) + (distributed ? " ranks, distributed" : " ranks, replicated");
      testing::ScratchDirectory scratch;
      const RunConfig config = tiny_run(size, 12, true, distributed);  // 12: every DP size below divides it
      Ranks straight(config);
      for (int iteration = 0; iteration < 4; ++iteration) straight.run_iteration();

      Ranks first(config);
      for (int iteration = 0; iteration < 2; ++iteration) first.run_iteration();
      const HostState saved = first.state();
      const auto errors = first.save(scratch.path());
      for (const std::string& error : errors) ASSERT_EQ(error, "") << what;
      const auto files = testing::tensor_files_of(scratch.path() / "iter_0000002");
      ASSERT_EQ(files.size(), static_cast<std::size_t>(size)) << what;
      EXPECT_TRUE(files.contains(checkpoint::shard_file_name(static_cast<int>(size) - 1, static_cast<int>(size)))) << what;

      // The shards reassembled (exports read them so) are the gathered state, bit for bit.
      const auto loaded = checkpoint::load_checkpoint(scratch.path());
      EXPECT_EQ(loaded.counters, saved.counters) << what;
      HostState reassembled = checkpoint::read_main_checkpoint<float>("production", config, first.rank(0).layout(), loaded);
      expect_same_state(saved, reassembled, what + ": reassembled shards");

      Ranks resumed(config);
      resumed.resume(scratch.path());
      expect_same_state(saved, resumed.state(), what + ": resumed");
      for (int iteration = 0; iteration < 2; ++iteration) resumed.run_iteration();
      expect_same_state(straight.state(), resumed.state(), what + ": 2 + resume + 2 vs 4 straight");

      for (const std::int64_t other : {1, 4}) {
        Ranks moved(tiny_run(other, 12, true, distributed));
        moved.resume(scratch.path());
        expect_same_state(saved, moved.state(), what + ": taken up by " + std::to_string(other) + " ranks");
      }
    }
  }
}

// What sharded saves and resumes ask of the trainer: its pieces (its shard of the main state,
// with either optimizer; none when it owns nothing) and the ranges it keeps (its shard with the
// distributed optimizer, else [0, N)); restore takes pieces of exactly those ranges and refuses
// any others.
TEST(DataParallel, TheTrainerSavesItsShardAsPiecesAndRestoresExactlyItsStateRanges) {
  for (const bool bucketed : {false, true}) {
    for (const bool distributed : {true, false}) {
      const std::string what = std::string(distributed ? "distributed" : "replicated") +
                               (bucketed ? ", buckets of one unit" : ", one bucket");
      RunConfig config = tiny_run(3, 3, false, distributed);
      config.parallel.overlap_grad_reduce = bucketed;
      config.parallel.ddp_bucket_size = bucketed ? 1 : 0;
      Ranks ranks(config);
      ranks.run_iteration();
      const HostState whole = ranks.state();
      const FlatShards& shards = ranks.rank(0).shards();
      ASSERT_EQ(shards.buckets.size() > 1, bucketed) << what;
      const auto total = static_cast<std::int64_t>(whole.params.size());
      for (int rank = 0; rank < 3; ++rank) {
        Trainer& trainer = ranks.rank(rank);
        const std::vector<FlatRange> owned = shards.owned(rank);
        if (bucketed) {
          EXPECT_GT(owned.size(), 1u) << what << ", rank " << rank;
        }
        const std::vector<FlatRange> kept = distributed ? owned : std::vector<FlatRange>{{0, total}};
        EXPECT_EQ(trainer.state_ranges(), kept) << what << ", rank " << rank;
        const auto pieces = trainer.shard_pieces();
        ASSERT_EQ(pieces.size(), owned.size()) << what << ", rank " << rank;
        for (std::size_t i = 0; i < pieces.size(); ++i) {
          const auto part = [&](const std::vector<float>& flat) {
            return std::vector<float>(flat.begin() + owned[i].begin, flat.begin() + owned[i].begin + owned[i].count);
          };
          EXPECT_EQ(pieces[i].begin, owned[i].begin) << what << ", rank " << rank;
          EXPECT_EQ(pieces[i].params, part(whole.params)) << what << ", rank " << rank;
          EXPECT_EQ(pieces[i].exp_avg, part(whole.exp_avg)) << what << ", rank " << rank;
          EXPECT_EQ(pieces[i].exp_avg_sq, part(whole.exp_avg_sq)) << what << ", rank " << rank;
        }
      }
    }
  }
  // One rank (so that a restore it wrongly accepted would not wait for the others): no pieces are
  // not its range [0, N), and neither is a piece one element longer, though it covers the range.
  Ranks one(tiny_run(1, 1, false, true));
  Trainer& trainer = one.rank(0);
  const auto total = static_cast<std::int64_t>(one.state().params.size());
  ASSERT_EQ(trainer.state_ranges(), (std::vector<FlatRange>{{0, total}}));
  EXPECT_THROW(trainer.restore(std::vector<MainStateSlice<float>>{}, trainer.counters()), std::invalid_argument);
  const auto longer = static_cast<std::size_t>(total + 1);
  const std::vector<MainStateSlice<float>> covering{
      {0, std::vector<float>(longer), std::vector<float>(longer), std::vector<float>(longer)}};
  EXPECT_THROW(trainer.restore(covering, trainer.counters()), std::invalid_argument);
}

// A checkpoint of small buckets (several slices per rank in each shard file, format 3) is taken up
// by any DP size and bucket size, and the same one continues bit-exactly.
TEST(DataParallel, ACheckpointOfSmallBucketsResumesOnAnyBucketAndDataParallelSize) {
  testing::ScratchDirectory scratch;
  const auto bucketed = [](std::int64_t ranks, bool buckets) {
    RunConfig config = tiny_run(ranks, 6, true, true);
    config.parallel.overlap_grad_reduce = buckets;
    config.parallel.overlap_param_gather = buckets;
    config.parallel.ddp_bucket_size = buckets ? 1 : 0;
    return config;
  };
  Ranks saved(bucketed(3, true));
  saved.run_iteration();
  ASSERT_EQ(saved.save(scratch.path()), std::vector<std::string>(3, ""));
  const HostState state = saved.state();
  saved.run_iteration();
  const HostState next = saved.state();
  for (const auto& [ranks, buckets] : std::vector<std::pair<std::int64_t, bool>>{{3, true}, {3, false}, {2, true}, {1, false}}) {
    const std::string what = std::to_string(ranks) + " ranks, " + (buckets ? "buckets of one unit" : "one bucket");
    Ranks resumed(bucketed(ranks, buckets));
    resumed.resume(scratch.path());
    expect_same_state(state, resumed.state(), what);
    if (ranks == 3) {
      resumed.run_iteration();
      expect_same_state(next, resumed.state(), what + ": the next iteration");
    }
  }
}

// A format 1 checkpoint (one rank) is read by range too: 3 ranks take it up exactly.
TEST(DataParallel, ThreeRanksResumeFromAOneRankCheckpoint) {
  testing::ScratchDirectory scratch;
  Ranks one(tiny_run(1, 3, false, true));
  one.run_iteration();
  ASSERT_EQ(one.save(scratch.path()).front(), "");
  EXPECT_TRUE(testing::tensor_files_of(scratch.path() / "iter_0000001").contains("model.safetensors"));
  Ranks three(tiny_run(3, 3, false, true));
  three.resume(scratch.path());
  expect_same_state(one.state(), three.state(), "one rank's checkpoint on 3 ranks");
}

// SPEC 9 atomicity with several writers: a rank that fails to write its shard, or rank 0 failing
// at the manifest, makes every rank throw naming the failure, and the previous checkpoint stays
// the tracker's, with no new directory and no staging leftovers.
TEST(DataParallel, AFailedShardedSaveFailsEveryRankAndLeavesThePreviousCheckpoint) {
  struct SimulatedFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  for (const auto& [failing_rank, step] : std::vector<std::pair<int, std::string>>{
           {1, checkpoint::shard_file_name(1, 3)}, {0, checkpoint::shard_file_name(0, 3)}, {0, "manifest.json"}}) {
    const std::string what = "rank " + std::to_string(failing_rank) + " failing after " + step;
    testing::ScratchDirectory scratch;
    Ranks ranks(tiny_run(3, 3, false, true));
    ranks.run_iteration();
    for (const std::string& error : ranks.save(scratch.path())) ASSERT_EQ(error, "") << what;
    ranks.run_iteration();
    checkpoint::SaveHooks hooks;
    hooks.after_step = [&step](std::string_view done) {
      if (done == step) throw SimulatedFailure("simulated failure after " + std::string(done));
    };
    const auto errors = ranks.save(scratch.path(), failing_rank, hooks);
    for (std::size_t rank = 0; rank < errors.size(); ++rank) {
      EXPECT_NE(errors[rank].find("simulated failure after " + step), std::string::npos) << what << ": rank " << rank << ": " << errors[rank];
      EXPECT_NE(errors[rank].find("rank " + std::to_string(failing_rank)), std::string::npos) << what << ": " << errors[rank];
    }
    EXPECT_EQ(checkpoint::read_latest_iteration(scratch.path()), 1) << what;
    EXPECT_FALSE(std::filesystem::exists(scratch.path() / "iter_0000002")) << what;
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(scratch.path())) names.push_back(entry.path().filename().string());
    EXPECT_EQ(names.size(), 2u) << what << ": only iter_0000001 and the tracker may remain";
    // The ranks go on, and the next save succeeds.
    ranks.run_iteration();
    for (const std::string& error : ranks.save(scratch.path())) EXPECT_EQ(error, "") << what;
    EXPECT_EQ(checkpoint::read_latest_iteration(scratch.path()), 3) << what;
  }
}

// A corrupted shard is refused naming the file, on the rank that reads it; the whole-state load
// (exports) refuses it too.
TEST(DataParallel, ACorruptedShardIsRefusedNamingTheFile) {
  testing::ScratchDirectory scratch;
  Ranks ranks(tiny_run(2, 2, false, true));
  ranks.run_iteration();
  for (const std::string& error : ranks.save(scratch.path())) ASSERT_EQ(error, "");
  const auto shard = scratch.path() / "iter_0000001" / checkpoint::shard_file_name(1, 2);
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.put('\x7f');
  }
  auto expect_refusal = [&](const std::function<void()>& load, const std::string& what) {
    try {
      load();
      ADD_FAILURE() << what << ": no exception";
    } catch (const std::exception& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(shard.string()), std::string::npos) << what << ": " << message;
      EXPECT_NE(message.find("CRC-32"), std::string::npos) << what << ": " << message;
    }
  };
  expect_refusal([&] { checkpoint::load_checkpoint(scratch.path()); }, "whole-state load");
  Ranks resumed(tiny_run(2, 2, false, true));
  expect_refusal([&] { resumed.resume(scratch.path()); }, "resume on 2 ranks");

  // A manifest whose shards do not tile the flat buffer is refused naming the manifest: rank 1's
  // range made to begin one element early overlaps rank 0's.
  const auto manifest_path = scratch.path() / "iter_0000001" / "manifest.json";
  auto manifest = nlohmann::json::parse(testing::bytes_of(manifest_path));
  ASSERT_EQ(manifest["format_version"], checkpoint::kRangedShardedCheckpointFormatVersion);
  manifest["shards"]["files"][1]["ranges"][0][0] = manifest["shards"]["files"][1]["ranges"][0][0].get<std::int64_t>() - 1;
  checkpoint::manifest::seal(manifest);  // past the manifest's checksum, to the ranges' check
  std::ofstream(manifest_path) << manifest.dump();
  try {
    checkpoint::read_main_state_slice(scratch.path() / "iter_0000001", resumed.rank(0).layout(), 0, 10);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(manifest_path.string()), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("overlaps"), std::string::npos) << error.what();
  }
}

TEST(DataParallel, ANonFiniteGradientSkipsTheUpdateOnEveryRank) {
  production::FaultSchedule faults;
  faults.nonfinite_gradient_iterations = {2};
  Ranks ranks(tiny_run(2, 4, false, true), faults);
  ranks.run_iteration();
  const HostState before = ranks.state();
  const auto records = ranks.run_iteration();
  for (const IterationRecord& record : records) {
    EXPECT_FALSE(record.update_successful);
    EXPECT_TRUE(std::isnan(record.grad_norm));
  }
  HostState after = ranks.state();
  EXPECT_EQ(after.counters.skipped_updates, 1);
  after.counters = before.counters;  // only the counters may move
  expect_same_state(before, after, "after a skipped update");
}

TEST(DataParallel, ADataParallelSizeTheRanksDoNotHaveIsRefused) {
  production::ProductionOptions options;
  options.device = production::Device::cpu;
  try {
    Trainer trainer(tiny_run(2, 4, false, false), testing::tiny_production_samples(), options);  // one rank, DP 2
    FAIL() << "no exception";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("mpirun -np 2"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tandem
