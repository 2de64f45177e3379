// `tandem train --engine production --device cpu` end to end, through the built binary (SPEC 9,
// 12): the header and iteration records (throughput included), `tandem audit` on a production
// log, checkpoints in F32, bit-exact resume through --load, --bf16, the skip limit; and
// data-parallel ranks launched by `mpirun -np 2/3` (skipped when mpirun is absent).
// Kind of comparison: exact (files, fields, exit codes) and deterministic (bytes of checkpoints).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::tensor_files_of;
using testing::read_log;
using testing::run_tandem;

class ProductionCli : public testing::TinyTrainCli {
 protected:
  // The tiny run (tests/support/tiny_train_cli.hpp) on the production engine's cpu backend.
  std::vector<std::string> tiny(const std::vector<std::string>& extra = {}) const {
    return tiny_train({"--engine", "production", "--device", "cpu"}, extra);
  }

  // A 2-rank run of 200 iterations into `stopped`, signalled during the run with its output in
  // ROOT/out.txt: it exited 0, rank 0 alone wrote `needle`, and it saved a checkpoint before the
  // end at the log's last iteration, both ranks' files. Fatal when the needle or the checkpoint is
  // missing or the run was not stopped early: call it under ASSERT_NO_FATAL_FAILURE.
  void expect_stopped_with_a_checkpoint(int exit_code, const std::string& needle, const fs::path& stopped) const {
    const std::string output = testing::bytes_of(root_ / "out.txt");
    EXPECT_EQ(exit_code, 0) << output;
    ASSERT_NE(output.find(needle), std::string::npos) << output;
    EXPECT_EQ(output.find(needle), output.rfind(needle)) << "rank 0 alone speaks: " << output;
    const std::optional<std::int64_t> at = checkpoint::read_latest_iteration(stopped);
    ASSERT_TRUE(at.has_value());
    ASSERT_LT(*at, 200) << "the run ended before the signal: the test proved nothing";
    EXPECT_EQ(read_log(stopped / "log.jsonl").back()["iteration"], *at);
    EXPECT_EQ(tensor_files_of(stopped / checkpoint::iteration_directory_name(*at)).size(), 2u);
  }
};

TEST_F(ProductionCli, LogHeaderRecordsAndAuditOnCpu) {
  const auto save = root_ / "run";
  const auto result = run_tandem(tiny({"--save", save.string(), "--audit-params", "8"}), "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto records = read_log(save / "log.jsonl");
  ASSERT_EQ(records.size(), 1u + 6u);
  EXPECT_EQ(records[0]["engine"], "production");
  EXPECT_EQ(records[0]["device"], "cpu");
  EXPECT_EQ(records[0]["main_precision"], "fp32");
  EXPECT_EQ(records[0]["compute_precision"], "fp32");
  EXPECT_TRUE(records[0].contains("throughput"));
  for (std::size_t i = 1; i < records.size(); ++i) {
    for (const char* field : {"loss", "grad_norm", "lr", "tokens_per_second", "model_flops", "mfu", "audit"}) {
      EXPECT_TRUE(records[i].contains(field)) << field << " in record " << i;
    }
    EXPECT_TRUE(records[i]["mfu"].is_null()) << "the cpu backend has no peak";
    EXPECT_GT(records[i]["model_flops"].get<double>(), 0.0);
  }
  const auto state = checkpoint::load_checkpoint(save);
  EXPECT_EQ(state.engine, "production");
  EXPECT_EQ(state.precision, "F32");
  const auto audit = run_tandem({"audit", (save / "log.jsonl").string()}, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  EXPECT_NE(audit.output.find("main precision fp32"), std::string::npos) << audit.output;
}

TEST_F(ProductionCli, ResumeThroughTheBinaryIsBitExact) {
  for (const bool bf16 : {false, true}) {
    const auto resumed = expect_resume_equals_straight(
        bf16 ? "bf16" : "fp32",
        [&](std::vector<std::string> extra) {
          if (bf16) extra.push_back("--bf16");
          return tiny(extra);
        },
        2, 6);
    // One rank writes the whole state (format 1).
    EXPECT_TRUE(tensor_files_of(resumed / "iter_0000006").contains("model.safetensors"));
  }
}

TEST_F(ProductionCli, SkipLimitStopsAfterACheckpoint) {
  const auto save = root_ / "skips";
  const auto result = run_tandem(tiny({"--save", save.string(), "--test-nonfinite-gradient-iterations", "2,3",
                                       "--max-consecutive-skips", "2"}),
                                 "", "2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("iteration 3"), std::string::npos) << result.output;
  EXPECT_TRUE(fs::exists(save / "iter_0000003"));
  const auto records = read_log(save / "log.jsonl");
  ASSERT_EQ(records.size(), 1u + 3u);
  EXPECT_FALSE(records[2]["update_successful"].get<bool>());
  EXPECT_EQ(records[3]["skipped_updates"], 2);
}

TEST_F(ProductionCli, ReferenceCheckpointIsRefusedNamingTheEngine) {
  const auto save = root_ / "reference";
  // 2 updates of a run whose decay spans the usual 24 samples (Megatron: warmup < decay).
  std::vector<std::string> arguments = tiny({"--save", save.string(), "--train-samples", "8", "--lr-decay-samples", "24"});
  arguments[2] = "reference";  // --engine reference
  ASSERT_EQ(run_tandem(arguments, "", "2>&1").exit_code, 0);
  const auto result = run_tandem(tiny({"--load", save.string()}), "", "2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("reference engine"), std::string::npos) << result.output;
}

// The iteration records without their timings (seconds, tokens/s, MFU differ run to run).
std::vector<nlohmann::json> numbers_of(const std::vector<nlohmann::json>& records) {
  std::vector<nlohmann::json> out;
  for (const auto& record : records) {
    if (record.value("type", "") != "iteration") continue;
    nlohmann::json numbers = record;
    for (const char* timing : {"seconds", "tokens_per_second", "model_flops_per_second", "mfu"}) numbers.erase(timing);
    out.push_back(numbers);
  }
  return out;
}

TEST_F(ProductionCli, TwoMpiRanksWithTheDistributedOptimizerEqualTheReplicatedBitForBit) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto replicated = root_ / "replicated";
  const auto distributed = root_ / "distributed";
  const auto a = run_tandem(tiny({"--save", replicated.string(), "--audit-params", "6"}), mpirun, "2>&1");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto b = run_tandem(tiny({"--save", distributed.string(), "--audit-params", "6",
                                  "--use-distributed-optimizer"}), mpirun, "2>&1");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("on 2 data-parallel ranks"), std::string::npos) << b.output;
  // Rank 0 alone speaks: one summary line, not two.
  EXPECT_EQ(b.output.find("loss "), b.output.rfind("loss ")) << b.output;

  const auto header = read_log(distributed / "log.jsonl").front();
  EXPECT_EQ(header["data_parallel"]["ranks"], 2);
  EXPECT_EQ(header["config"]["parallel"]["data_parallel"], 2);
  EXPECT_EQ(numbers_of(read_log(replicated / "log.jsonl")), numbers_of(read_log(distributed / "log.jsonl")));
  // Each rank wrote its shard (format 3); the two optimizers' shards are the same bytes.
  const auto shards = tensor_files_of(distributed / "iter_0000006");
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_TRUE(shards.contains("shard_00000_of_00002.safetensors"));
  EXPECT_TRUE(shards.contains("shard_00001_of_00002.safetensors"));
  EXPECT_EQ(tensor_files_of(replicated / "iter_0000006"), shards);
  // The audit recomputes every audited element's update from the 2-rank log.
  const auto audit = run_tandem({"audit", (distributed / "log.jsonl").string()}, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
}

TEST_F(ProductionCli, ResumeOnMpiRanksIsBitExactAndOneRankTakesTheCheckpointUp) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto straight = root_ / "straight";
  const auto resumed = root_ / "resumed";
  const std::vector<std::string> ranks2 = {"--use-distributed-optimizer", "--bf16"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), ranks2.begin(), ranks2.end());
    return tiny(extra);
  };
  ASSERT_EQ(run_tandem(with({"--save", straight.string()}), mpirun, "2>&1").exit_code, 0);
  const auto first = run_tandem(with({"--save", resumed.string(), "--exit-interval", "2"}), mpirun, "2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(fs::exists(resumed / "iter_0000002"));
  fs::copy(resumed, root_ / "half", fs::copy_options::recursive);
  const auto second = run_tandem(with({"--save", resumed.string(), "--load", resumed.string()}), mpirun, "2>&1");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(tensor_files_of(straight / "iter_0000006"), tensor_files_of(resumed / "iter_0000006"));
  // Any data-parallel size takes a checkpoint up: one rank continues from the 2-rank shards.
  const auto single = run_tandem(tiny({"--load", (root_ / "half").string(), "--bf16",
                                       "--save", (root_ / "single").string()}), "", "2>&1");
  EXPECT_EQ(single.exit_code, 0) << single.output;
  EXPECT_NE(single.output.find("resumed from"), std::string::npos) << single.output;
  EXPECT_TRUE(fs::exists(root_ / "single" / "iter_0000006"));
  // The shards export as one Hugging Face model: its tensors are the reassembled main weights.
  const auto exported = run_tandem({"export", "--load", (root_ / "half").string(), "--hf", (root_ / "hf").string()}, "", "2>&1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const auto hf = checkpoint::read_safetensors(root_ / "hf" / "model.safetensors");
  const auto saved = checkpoint::load_checkpoint(root_ / "half");
  for (const auto& tensor : saved.model_tensors) {
    EXPECT_EQ(checkpoint::find_tensor(hf.tensors, tensor.name, "export"), tensor) << tensor.name;
  }
}

// Megatron's overlap options on MPI ranks: the same numbers as without them, the header says what
// overlapped where, and a checkpoint written with small buckets (several slices per rank in each
// shard file) resumes without them to the bytes of the straight run.
TEST_F(ProductionCli, OverlapOnMpiRanksChangesNoBitAndItsCheckpointResumesWithoutIt) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const std::vector<std::string> base = {"--use-distributed-optimizer", "--bf16", "--audit-params", "6"};
  const std::vector<std::string> overlap = {"--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "1"};
  auto with = [&](std::vector<std::string> extra, bool overlapped) {
    extra.insert(extra.end(), base.begin(), base.end());
    if (overlapped) extra.insert(extra.end(), overlap.begin(), overlap.end());
    return tiny(extra);
  };
  const auto plain = root_ / "plain";
  const auto overlapped = root_ / "overlapped";
  const auto switched = root_ / "switched";
  const auto a = run_tandem(with({"--save", plain.string()}, false), mpirun, "2>&1");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto b = run_tandem(with({"--save", overlapped.string()}, true), mpirun, "2>&1");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(numbers_of(read_log(plain / "log.jsonl")), numbers_of(read_log(overlapped / "log.jsonl")));
  const auto header = read_log(overlapped / "log.jsonl").front();
  EXPECT_EQ(header["data_parallel"]["overlap"]["grad_reduce"], true);
  EXPECT_EQ(header["data_parallel"]["overlap"]["param_gather"], true);
  EXPECT_EQ(header["data_parallel"]["overlap"]["lane"], "worker thread") << header["data_parallel"];
  EXPECT_GT(header["data_parallel"]["gradient_buckets"].get<int>(), 2) << header["data_parallel"];
  EXPECT_EQ(header["config"]["parallel"]["ddp_bucket_size"], 1);
  EXPECT_EQ(read_log(plain / "log.jsonl").front()["data_parallel"]["gradient_buckets"], 1);

  // Stop after 2 iterations with small buckets, go on without overlap: the straight run's bytes.
  const auto first = run_tandem(with({"--save", switched.string(), "--exit-interval", "2"}, true), mpirun, "2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto second = run_tandem(with({"--save", switched.string(), "--load", switched.string()}, false), mpirun, "2>&1");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(tensor_files_of(plain / "iter_0000006"), tensor_files_of(switched / "iter_0000006"));
}

// Without --data-cache both engines build the embedded corpus where --help says:
// $TMPDIR/tandem-default-corpus (the production engine once built it elsewhere).
TEST_F(ProductionCli, WithoutDataCacheTheCorpusIsBuiltInTheDocumentedFolder) {
  for (const std::string engine : {"production", "reference"}) {
    const auto tmp = root_ / ("tmp-" + engine);
    fs::create_directories(tmp);
    std::vector<std::string> arguments = tiny({"--train-samples", "8", "--lr-decay-samples", "24"});
    arguments[2] = engine;  // tiny_train puts the engine's name there
    const auto cache = std::find(arguments.begin(), arguments.end(), "--data-cache");
    ASSERT_NE(cache, arguments.end());
    arguments.erase(cache, cache + 2);
    const auto result = run_tandem(arguments, "TMPDIR=" + testing::shell_quoted(tmp.string()) + " ", "2>&1");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    std::vector<std::string> made;
    for (const auto& entry : fs::directory_iterator(tmp)) made.push_back(entry.path().filename().string());
    EXPECT_EQ(made, std::vector<std::string>{"tandem-default-corpus"}) << engine;
  }
}

// Megatron's --exit-signal-handler as Slurm uses it: SIGTERM reaches one rank only (here the last
// child of mpirun), yet both ranks stop after the same iteration with one checkpoint and exit 0;
// resuming from it gives the straight run's bits.
TEST_F(ProductionCli, SigtermToOneRankStopsEveryRankWithACheckpointAndResumeIsBitExact) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  auto with = [&](const fs::path& save, std::vector<std::string> extra) {
    const std::vector<std::string> longer = {"--train-samples", "800", "--use-distributed-optimizer",
                                             "--data-parallel-size", "2", "--save", save.string()};
    extra.insert(extra.begin(), longer.begin(), longer.end());
    return tiny(extra);
  };
  const auto straight = root_ / "straight";
  const auto stopped = root_ / "stopped";
  ASSERT_EQ(run_tandem(with(straight, {}), mpirun, "2>&1").exit_code, 0);

  // Once 3 iterations are logged, SIGTERM to one child of mpirun (a rank).
  const int exit_code = testing::signal_tandem_during_run(
      with(stopped, {"--exit-signal-handler"}), mpirun, (root_ / "out.txt").string(),
      (stopped / "log.jsonl").string(), 3, testing::SignalTarget::last_child);
  // Rank 0 speaks: it names the signal when it got it, else says another rank did.
  ASSERT_NO_FATAL_FAILURE(expect_stopped_with_a_checkpoint(exit_code, " (--exit-signal-handler); checkpoint saved", stopped));

  const auto resumed = run_tandem(with(stopped, {"--load", stopped.string()}), mpirun, "2>&1");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(tensor_files_of(straight / "iter_0000200"), tensor_files_of(stopped / "iter_0000200"));
}

// Under mpirun the user signals mpirun. Open MPI's mpirun kills the ranks about 2 s after
// forwarding a SIGTERM (a 52M-parameter run got no checkpoint), but forwards SIGUSR1 and leaves them
// running: with --exit-signal-handler, SIGUSR1 to mpirun stops every rank after the same iteration
// with a checkpoint, and mpirun exits 0 (README "Stopping a run").
TEST_F(ProductionCli, SigusrOneToMpirunStopsEveryRankWithACheckpoint) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto stopped = root_ / "stopped";
  const auto arguments = tiny({"--train-samples", "800", "--use-distributed-optimizer", "--data-parallel-size", "2",
                               "--save", stopped.string(), "--exit-signal-handler"});
  const int exit_code = testing::signal_tandem_during_run(arguments, mpirun, (root_ / "out.txt").string(),
                                                          (stopped / "log.jsonl").string(), 3,
                                                          testing::SignalTarget::process, "USR1");
  ASSERT_NO_FATAL_FAILURE(
      expect_stopped_with_a_checkpoint(exit_code, ": SIGUSR1 received (--exit-signal-handler); checkpoint saved", stopped));
}

// --exit-duration-in-mins: every rank passes a few milliseconds during the first iteration, so the
// run stops after it, saving; the message names the option.
// A run that cannot fit is refused before it allocates (a 10^8-position sequence ran 12 s and took
// 6.4 GiB before std::bad_alloc): exit 2 naming the field, what it needs and what there is; under
// mpirun every rank refuses alike (no rank is left waiting).
TEST_F(ProductionCli, ARunThatCannotFitIsRefusedBeforeItAllocates) {
  const auto huge = tiny({"--seq-length", "100000000"});
  const auto alone = run_tandem(huge, "", "2>&1");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  for (const char* words : {"--seq-length = 100000000", "GiB of stored activations", "GiB available"}) {
    EXPECT_NE(alone.output.find(words), std::string::npos) << words << "\n" << alone.output;
  }
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) return;
  const auto ranks = run_tandem(huge, mpirun, "2>&1");
  EXPECT_NE(ranks.exit_code, 0) << ranks.output;
  EXPECT_NE(ranks.output.find("--seq-length = 100000000"), std::string::npos) << ranks.output;
}

// After kill -9 of mpirun, the ranks went on training and saving (in one trial to the end), racing
// the job's restart: now the kernel kills each rank when its launcher dies (PR_SET_PDEATHSIG).
TEST_F(ProductionCli, TheRanksStopWhenMpirunIsKilled) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto save = root_ / "orphans";
  std::string command = mpirun + testing::shell_quoted(TANDEM_BINARY);
  for (const auto& word : tiny({"--save", save.string(), "--train-samples", "400000", "--lr-decay-samples", "400000"})) {
    command += " " + testing::shell_quoted(word);
  }
  const std::string log = testing::shell_quoted((save / "log.jsonl").string());
  // The ranks' command lines (not mpirun's, nor this script's shell): the binary, then the save.
  const std::string marker = testing::shell_quoted("^" + std::string(TANDEM_BINARY) + " train .*" + save.string());
  const auto result = testing::run_shell(
      command + " > /dev/null 2>&1 &\n"
      "launcher=$!\n"
      "i=0; while [ $i -lt 1200 ]; do grep -q '\"type\":\"iteration\"' " + log +
      " 2>/dev/null && break; sleep 0.05; i=$((i+1)); done\n"
      "echo ranks_before=$(pgrep -f -c -- " + marker + ")\n"
      "kill -9 $launcher; wait $launcher 2>/dev/null\n"
      "i=0; while [ $i -lt 100 ]; do [ \"$(pgrep -f -c -- " + marker + ")\" = 0 ] && break; sleep 0.05; i=$((i+1)); done\n"
      "echo ranks_after=$(pgrep -f -c -- " + marker + ")\n"
      "pkill -9 -f -- " + marker + "\n");
  EXPECT_NE(result.output.find("ranks_before=2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("ranks_after=0"), std::string::npos) << result.output;
}

TEST_F(ProductionCli, ExitDurationStopsEveryRankAfterTheIterationThatPassesIt) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto save = root_ / "save";
  const auto result = run_tandem(tiny({"--save", save.string(), "--data-parallel-size", "2",
                                       "--exit-duration-in-mins", "0.0001"}), mpirun, "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("exiting at iteration 1: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("minutes passed (--exit-duration-in-mins 0.0001); checkpoint saved"), std::string::npos)
      << result.output;
  EXPECT_EQ(checkpoint::read_latest_iteration(save), 1);
}

// SPEC 8's other skip condition through the binary: a NaN loss on 2 ranks (the gradients are
// finite) skips the update on every rank, and the run goes on.
TEST_F(ProductionCli, ANonFiniteLossSkipsTheUpdateOnEveryMpiRank) {
  const std::string mpirun = testing::mpirun_prefix(2);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  const auto save = root_ / "loss";
  const auto result = run_tandem(tiny({"--save", save.string(), "--test-nonfinite-loss-iterations", "2",
                                       "--use-distributed-optimizer"}),
                                 mpirun, "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto records = read_log(save / "log.jsonl");
  ASSERT_EQ(records.size(), 1u + 6u);
  EXPECT_TRUE(records[1]["update_successful"].get<bool>());
  EXPECT_FALSE(records[2]["update_successful"].get<bool>());
  EXPECT_TRUE(records[2]["loss"].is_null()) << records[2].dump();  // NaN is written as null
  EXPECT_TRUE(std::isfinite(records[2]["grad_norm"].get<double>()));
  EXPECT_EQ(records[2]["step"], 1);
  EXPECT_EQ(records[6]["skipped_updates"], 1);
  EXPECT_EQ(records[6]["step"], 5);
}

TEST_F(ProductionCli, LaunchesThatDoNotFitTheRunAreRefusedWithExitTwo) {
  // DP 2 asked of one process.
  const auto alone = run_tandem(tiny({"--data-parallel-size", "2"}), "", "2>&1");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_NE(alone.output.find("mpirun -np 2"), std::string::npos) << alone.output;
  const std::string mpirun = testing::mpirun_prefix(3);
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed";
  // 3 ranks cannot split a global batch of 4 (mbs 2): one message, from rank 0, and exit 2.
  const auto three = run_tandem(tiny(), mpirun, "2>&1");
  EXPECT_NE(three.exit_code, 0) << three.output;
  EXPECT_NE(three.output.find("--global-batch-size"), std::string::npos) << three.output;
  EXPECT_EQ(three.output.find("--global-batch-size"), three.output.rfind("--global-batch-size")) << three.output;
  // The reference engine is one process.
  std::vector<std::string> reference = tiny();
  reference[2] = "reference";
  const auto ranks = run_tandem(reference, testing::mpirun_prefix(2), "2>&1");
  EXPECT_NE(ranks.exit_code, 0) << ranks.output;
  EXPECT_NE(ranks.output.find("one process"), std::string::npos) << ranks.output;
}

}  // namespace
}  // namespace tandem
