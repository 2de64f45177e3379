// `tandem train --engine reference` and `tandem audit` through the real binary, on the embedded
// corpus: logs carry what SPEC 12 lists, the audit passes and rejects a tampered log, a resumed
// run equals a straight one bit for bit (SPEC 9), skipped updates and the skip limit (SPEC 8),
// iteration-0 checkpoints, and bad input exits non-zero naming the field.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "production/backend.hpp"
#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::bytes_of;
using testing::read_log;
using testing::run_tandem;

class TrainCli : public testing::TinyTrainCli {
 protected:
  // The tiny run (tests/support/tiny_train_cli.hpp) on the reference engine.
  std::vector<std::string> tiny(const std::vector<std::string>& extra = {}) const {
    return tiny_train({"--engine", "reference"}, extra);
  }
};

TEST_F(TrainCli, LogCarriesTheHeaderAndEveryIterationField) {
  const auto log = root_ / "log.jsonl";
  const auto result = run_tandem(tiny({"--log", log.string()}), "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto records = read_log(log);
  ASSERT_EQ(records.size(), 1u + 6u);
  EXPECT_EQ(records[0]["type"], "header");
  EXPECT_EQ(records[0]["engine"], "reference");
  EXPECT_EQ(records[0]["config"]["batch"]["global_batch_size"], 4);
  EXPECT_TRUE(records[0].contains("parameter_groups"));
  for (const char* field :
       {"iteration", "consumed_samples", "lr", "wd", "loss", "grad_norm", "clip_coeff", "clipped",
        "update_successful", "step", "input_tokens", "loss_tokens", "pad_tokens",
        "successful_updates", "skipped_updates", "total_input_tokens", "total_loss_tokens",
        "total_pad_tokens"}) {
    EXPECT_TRUE(records[1].contains(field)) << field;
  }
  EXPECT_EQ(records[1]["lr"], 0.0);  // SPEC 8: update 1 uses --lr-warmup-init (0)
  EXPECT_EQ(records[6]["consumed_samples"], 24);
  EXPECT_EQ(records[6]["total_input_tokens"], 24 * 32);  // concat packing: no padding
}

TEST_F(TrainCli, AuditPassesOnARealLogAndRejectsATamperedOne) {
  const auto log = root_ / "log.jsonl";
  ASSERT_EQ(run_tandem(tiny({"--log", log.string(), "--audit-params", "6"})).exit_code, 0);
  const auto audit = run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  EXPECT_NE(audit.output.find("verdict: every check holds"), std::string::npos) << audit.output;

  // Negative control: move one logged new value by 1e-12 relative; the audit must refuse it.
  auto records = read_log(log);
  auto& entry = records[3]["audit"][0];
  entry["new_value"] = entry["new_value"].get<double>() * (1 + 1e-12);
  const auto tampered = root_ / "tampered.jsonl";
  {
    std::ofstream out(tampered);
    for (const auto& record : records) out << record.dump() << "\n";
  }
  const auto refused = run_tandem({"audit", tampered.string()}, "", "2>&1");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("MISMATCH"), std::string::npos) << refused.output;
}

// A run killed mid-record leaves a torn last line. The resumed run starts its header on a new line
// (it was glued onto the torn record, corrupting the log mid-file), and tandem audit skips a torn
// last line, or one before a resumed run's header, with a warning (it refused the whole log);
// anything else that is not JSON is still refused.
TEST_F(TrainCli, ATornLastLineStaysAloneWhenTheRunResumesAndAuditSkipsItWithAWarning) {
  const auto save = root_ / "ckpt";
  const auto log = save / "log.jsonl";
  ASSERT_EQ(run_tandem(tiny({"--save", save.string(), "--exit-interval", "2", "--audit-params", "6"})).exit_code, 0);
  const auto full_size = std::filesystem::file_size(log);
  std::filesystem::resize_file(log, full_size - 25);  // the last record loses its end and newline
  const auto torn_only = run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_EQ(torn_only.exit_code, 0) << torn_only.output;
  EXPECT_NE(torn_only.output.find("warning: line 3 is torn"), std::string::npos) << torn_only.output;

  ASSERT_EQ(run_tandem(tiny({"--load", save.string(), "--save", save.string(), "--audit-params", "6"})).exit_code, 0);
  std::ifstream input(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(input, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 2u + 1u + 4u);  // header, 2 records (one torn), header, 4 records
  const auto parses = [](const std::string& line) { return nlohmann::json::accept(line); };
  EXPECT_FALSE(parses(lines[2]));
  for (const std::size_t whole : {0u, 1u, 3u, 4u, 7u}) EXPECT_TRUE(parses(lines[whole])) << whole;
  EXPECT_EQ(nlohmann::json::parse(lines[3])["type"], "header");
  const auto resumed = run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("before a resumed run's header"), std::string::npos) << resumed.output;

  // A damaged record in the middle of a run is not a torn write: refused.
  {
    std::ofstream out(log, std::ios::trunc);
    for (std::size_t i = 0; i < lines.size(); ++i) out << (i == 5 ? "{\"type\": \"iteration\", \"itera" : lines[i]) << "\n";
  }
  const auto damaged = run_tandem({"audit", log.string()}, "", "2>&1");
  EXPECT_NE(damaged.exit_code, 0) << damaged.output;
  EXPECT_NE(damaged.output.find("line 6 is not JSON"), std::string::npos) << damaged.output;
}

// A restart that forgot --load, into a --save whose run is further on, is refused before anything
// is written (it truncated log.jsonl and moved the tracker back, 6 -> 3): both engines.
TEST_F(TrainCli, ARestartWithoutLoadIntoAFurtherSaveIsRefusedAndLosesNothing) {
  for (const std::string engine : {"reference", "production"}) {
    const auto save = root_ / ("ckpt-" + engine);
    const auto run = [&](const std::vector<std::string>& extra) {
      return run_tandem(tiny_train({"--engine", engine, "--device", "cpu"}, extra), "", "2>&1");
    };
    ASSERT_EQ(run({"--save", save.string()}).exit_code, 0);
    const auto log_before = testing::bytes_of(save / "log.jsonl");
    const auto tracker_before = testing::bytes_of(save / "latest_checkpointed_iteration.txt");
    const auto restarted = run({"--save", save.string(), "--exit-interval", "3"});
    EXPECT_EQ(restarted.exit_code, 2) << restarted.output;
    EXPECT_NE(restarted.output.find("already holds a run's checkpoints up to iteration 6"), std::string::npos)
        << restarted.output;
    EXPECT_NE(restarted.output.find("--load " + save.string()), std::string::npos) << restarted.output;
    EXPECT_EQ(testing::bytes_of(save / "log.jsonl"), log_before) << engine;
    EXPECT_EQ(testing::bytes_of(save / "latest_checkpointed_iteration.txt"), tracker_before) << engine;
    // Resuming it is what the message says to do, and works.
    EXPECT_EQ(run({"--save", save.string(), "--load", save.string()}).exit_code, 0);
  }
}

// Two runs started into one --save mixed their checkpoints and tore the log: the second (either
// engine) now refuses at start, naming the holder, and loses nothing; the lock dies with its
// process, even under kill -9, so the directory is usable at once afterwards.
TEST_F(TrainCli, ASecondRunIntoTheSameSaveIsRefusedNamingTheHolderUntilTheFirstDies) {
  const auto save = root_ / "shared";
  const auto command = [&](const std::string& engine, const std::vector<std::string>& extra) {
    std::string line = testing::shell_quoted(TANDEM_BINARY);
    for (const auto& word : tiny_train({"--engine", engine, "--device", "cpu"}, extra)) line += " " + testing::shell_quoted(word);
    return line;
  };
  const std::string log = testing::shell_quoted((save / "log.jsonl").string());
  const auto result = testing::run_shell(
      command("production", {"--save", save.string(), "--train-samples", "400000", "--lr-decay-samples", "400000"}) +
      " > /dev/null 2>&1 &\n"
      "first=$!\n"
      "i=0; while [ $i -lt 1200 ]; do grep -q '\"type\":\"iteration\"' " + log +
      " 2>/dev/null && break; sleep 0.05; i=$((i+1)); done\n" +
      command("production", {"--save", save.string()}) + " > " + testing::shell_quoted((root_ / "second.txt").string()) +
      " 2>&1; echo second=$?\n" +
      command("reference", {"--save", save.string()}) + " > " + testing::shell_quoted((root_ / "third.txt").string()) +
      " 2>&1; echo third=$?\n"
      "echo first_pid=$first\n"
      "kill -9 $first; wait $first 2>/dev/null\n" +
      command("reference", {"--save", save.string(), "--load", save.string()}) + " > /dev/null 2>&1; echo after=$?\n");
  EXPECT_NE(result.output.find("second=2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("third=2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("after=0"), std::string::npos) << result.output;
  const std::string pid_line = result.output.substr(result.output.find("first_pid=") + 10);
  const std::string pid = pid_line.substr(0, pid_line.find('\n'));
  for (const char* refused : {"second.txt", "third.txt"}) {
    const std::string text = testing::bytes_of(root_ / refused);
    EXPECT_NE(text.find("is in use by another run (process " + pid + " on "), std::string::npos) << refused << ": " << text;
  }
}

TEST_F(TrainCli, ResumeEqualsRunningStraightBitwise) {
  expect_resume_equals_straight("tiny", [&](std::vector<std::string> extra) { return tiny(extra); }, 4, 6);
}

// The reference engine runs the same loop in one process: SIGTERM to it stops the run after the
// iteration in progress with a checkpoint, exit 0; without --save it says nothing was saved.
// SIGINT (Ctrl-C) is handled alike when the handler is on (it killed the run).
TEST_F(TrainCli, SigtermWithTheExitSignalHandlerStopsWithACheckpoint) {
  for (const bool saving : {true, false}) {
    const auto save = root_ / (saving ? "save" : "unsaved");
    std::vector<std::string> extra = {"--train-samples", "4000", "--exit-signal-handler", "--log", (root_ / "log.jsonl").string()};
    if (saving) extra.insert(extra.end(), {"--save", save.string()});
    std::filesystem::remove(root_ / "log.jsonl");
    const std::string signal = saving ? "TERM" : "INT";
    const int exit_code = testing::signal_tandem_during_run(tiny(extra), "", (root_ / "out.txt").string(),
                                                            (root_ / "log.jsonl").string(), 2,
                                                            testing::SignalTarget::process, signal);
    const std::string output = testing::bytes_of(root_ / "out.txt");
    EXPECT_EQ(exit_code, 0) << output;
    const std::string needle = saving ? ": SIGTERM received (--exit-signal-handler); checkpoint saved"
                                      : ": SIGINT received (--exit-signal-handler); no --save, so nothing was saved";
    EXPECT_NE(output.find(needle), std::string::npos) << output;
    const auto last = read_log(root_ / "log.jsonl").back()["iteration"].get<std::int64_t>();
    EXPECT_LT(last, 1000) << "the run ended before the signal: the test proved nothing";
    if (saving) {
      EXPECT_EQ(checkpoint::read_latest_iteration(save), last);
    }
  }
}

// A stop signal during the startup (before MPI, the configuration and the data are ready) is held
// until the run can stop: the end of its first iteration, with a checkpoint, exit 0. It killed the
// rank (exit 143), because the handler was installed only after the configuration was built. The
// signal lands inside the startup deterministically: --config names a FIFO, the test's shell opens
// it for writing (which returns only once tandem has opened it to read the configuration), sends
// SIGTERM, and only then writes the (empty) configuration. Both engines.
TEST_F(TrainCli, SigtermDuringTheStartupStopsAfterTheFirstIterationWithACheckpoint) {
  for (const std::string engine : {"reference", "production"}) {
    const auto save = root_ / (engine + "-save");
    const auto fifo = root_ / (engine + "-config.json");
    const auto output_file = root_ / (engine + "-out.txt");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << fifo;
    const auto arguments = tiny_train({"--engine", engine, "--device", "cpu"},
                                      {"--train-samples", "4000", "--exit-signal-handler", "--save", save.string(),
                                       "--config", fifo.string()});
    std::string command = testing::shell_quoted(TANDEM_BINARY);
    for (const auto& argument : arguments) command += " " + testing::shell_quoted(argument);
    const auto result = testing::run_shell(
        command + " > " + testing::shell_quoted(output_file.string()) + " 2>&1 &\n"
        "started=$!\n"
        // The open for writing returns once tandem opens the FIFO to read its configuration (at
        // most 60 s: a tandem that failed before it would leave the open waiting for ever).
        "timeout 60 sh -c 'exec 3> \"$1\"; kill -TERM \"$2\"; printf \"{}\" >&3' sh " +
        testing::shell_quoted(fifo.string()) + " $started\n"
        "wait $started; echo $?\n");
    const std::string output = testing::bytes_of(output_file);
    EXPECT_EQ(result.output, "0\n") << engine << " exited with " << result.output << output;
    EXPECT_NE(output.find("exiting at iteration 1: SIGTERM received (--exit-signal-handler); checkpoint saved"),
              std::string::npos) << engine << ": " << output;
    EXPECT_EQ(checkpoint::read_latest_iteration(save), std::optional<std::int64_t>(1)) << engine << ": " << output;
  }
}

// Megatron's job-script pattern, --load = --save on every (re)start: a --load that holds no
// checkpoint (missing, or empty) starts from the initialization with a warning (it exited 1), and
// the requeued job resumes. Both engines.
TEST_F(TrainCli, ALoadWithoutACheckpointStartsFromTheInitializationAndTheRequeueResumes) {
  for (const std::string engine : {"reference", "production"}) {
    const auto missing = root_ / (engine + "-missing");
    const auto empty = root_ / (engine + "-empty");
    std::filesystem::create_directories(empty);
    for (const auto& directory : {missing, empty}) {
      const auto run = [&](const std::vector<std::string>& extra) {
        std::vector<std::string> arguments = tiny_train({"--engine", engine, "--device", "cpu"}, extra);
        arguments.insert(arguments.end(), {"--load", directory.string(), "--save", directory.string()});
        return run_tandem(arguments, "", "2>&1");
      };
      const auto first = run({"--exit-interval", "2"});
      ASSERT_EQ(first.exit_code, 0) << engine << " " << directory << ": " << first.output;
      EXPECT_NE(first.output.find("warning: --load " + directory.string() + " holds no checkpoint"), std::string::npos)
          << first.output;
      const auto requeued = run({});
      ASSERT_EQ(requeued.exit_code, 0) << requeued.output;
      EXPECT_NE(requeued.output.find("resumed from " + directory.string() + " at iteration 2"), std::string::npos)
          << requeued.output;
      EXPECT_EQ(requeued.output.find("warning: --load"), std::string::npos) << requeued.output;
      EXPECT_TRUE(std::filesystem::exists(directory / "iter_0000006")) << directory;
    }
  }
}

TEST_F(TrainCli, AChangedScheduleOnResumeIsAnErrorUnlessOverridden) {
  const auto save = root_ / "ckpt";
  ASSERT_EQ(run_tandem(tiny({"--save", save.string(), "--exit-interval", "2"})).exit_code, 0);
  const auto refused =
      run_tandem(tiny({"--load", save.string(), "--lr", "1e-3"}), "", "2>&1");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("--lr"), std::string::npos) << refused.output;
  const auto allowed = run_tandem(
      tiny({"--load", save.string(), "--lr", "1e-3", "--override-opt-param-scheduler"}), "",
      "2>&1");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_NE(allowed.output.find("note: --lr changed: the checkpoint's run had 0.003, this run has 0.001"),
            std::string::npos)
      << allowed.output;
}

// A longer run on resume changes the schedule's spans that follow --train-samples: the error names
// the user's option and the override, never an internal field (it named --wd-incr-samples, which
// does not exist).
TEST_F(TrainCli, ALongerRunOnResumeNamesTrainSamplesAndTheOverride) {
  const auto save = root_ / "ckpt";
  ASSERT_EQ(run_tandem(tiny({"--save", save.string(), "--exit-interval", "2"})).exit_code, 0);
  const auto refused = run_tandem(tiny({"--load", save.string(), "--train-samples", "48"}), "", "2>&1");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--train-samples"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("--override-opt-param-scheduler"), std::string::npos) << refused.output;
  EXPECT_EQ(refused.output.find("--wd-incr-samples"), std::string::npos) << refused.output;
}

// Data settings may change on resume (Megatron: a new blend mid-run), and the run says so on the
// console and in the log header's resume_changes; a resume without changes records an empty list.
TEST_F(TrainCli, AChangedDataSettingOnResumeIsAllowedAndReported) {
  const auto save = root_ / "ckpt";
  ASSERT_EQ(run_tandem(tiny({"--save", save.string(), "--exit-interval", "2"})).exit_code, 0);
  const auto log = root_ / "resumed.jsonl";
  const auto changed = run_tandem(
      tiny({"--load", save.string(), "--data-order", "sequential", "--log", log.string()}), "", "2>&1");
  ASSERT_EQ(changed.exit_code, 0) << changed.output;
  const std::string change = "--data-order changed: the checkpoint's run had \"shuffled\", this run has \"sequential\"";
  EXPECT_NE(changed.output.find("note: " + change), std::string::npos) << changed.output;
  EXPECT_EQ(read_log(log).front()["resume_changes"], nlohmann::json::array({change}));

  const auto same_log = root_ / "same.jsonl";
  ASSERT_EQ(run_tandem(tiny({"--load", save.string(), "--log", same_log.string()})).exit_code, 0);
  EXPECT_EQ(read_log(same_log).front()["resume_changes"], nlohmann::json::array());
}

TEST_F(TrainCli, SkippedUpdatesAreLoggedAndTheSkipLimitStopsAfterAFinalCheckpoint) {
  const auto log = root_ / "log.jsonl";
  ASSERT_EQ(run_tandem(tiny({"--log", log.string(), "--test-nonfinite-gradient-iterations", "2"}))
                .exit_code,
            0);
  const auto records = read_log(log);
  EXPECT_EQ(records[2]["update_successful"], false);
  EXPECT_EQ(records[2]["step"], 1);
  EXPECT_EQ(records[2]["skipped_updates"], 1);
  EXPECT_EQ(records[3]["step"], 2);
  EXPECT_EQ(records[6]["successful_updates"], 5);

  const auto save = root_ / "ckpt";
  const auto stopped =
      run_tandem(tiny({"--save", save.string(), "--test-nonfinite-gradient-iterations", "2,3",
                       "--max-consecutive-skips", "2"}),
                 "", "2>&1");
  EXPECT_EQ(stopped.exit_code, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("iteration 3"), std::string::npos) << stopped.output;
  EXPECT_TRUE(fs::exists(save / "iter_0000003" / "manifest.json"));
}

TEST_F(TrainCli, ZeroTrainSamplesWritesTheInitializedModelAsIterationZero) {
  const auto save = root_ / "init";
  const auto result = run_tandem(tiny({"--train-samples", "0", "--save", save.string()}), "", "2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(save / "iter_0000000" / "model.safetensors"));
}

TEST_F(TrainCli, BadInputExitsNonZeroNamingTheField) {
  const auto bad = run_tandem(tiny({"--global-batch-size", "5"}), "", "2>&1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("--global-batch-size"), std::string::npos) << bad.output;
  const auto unknown = run_tandem(tiny({"--no-such-option"}), "", "2>&1");
  EXPECT_EQ(unknown.exit_code, 2);
}

}  // namespace
}  // namespace tandem
