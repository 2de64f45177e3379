// The random-kill campaign (issue 14; docs/RELIABILITY.md "Kills and crashes"), repeatable: a tiny
// production run that saves every iteration is killed with SIGKILL at random moments, and
// restarted each time with --load = --save (Megatron's job-script pattern), until one start runs to
// the end. After every kill the newest checkpoint must load (every file's size and CRC-32, every
// manifest field), the tracker must never move back, and every complete checkpoint directory must
// load; at the end the last checkpoint's tensor files must equal a straight run's byte for byte,
// and its counters too. The default suite kills one rank a few times (about 8 s); the soak
// (KillCampaign.Soak*, `ctest -L soak`) one rank a hundred times, and two ranks under mpirun with
// the distributed optimizer forty times. The kill times come from a seeded
// generator: TANDEM_KILL_CAMPAIGN_SEED=S repeats a campaign's delays (where each lands depends on
// the machine's speed), and every failure prints its seed.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "tests/support/files.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Starts TANDEM_BINARY with `arguments` in a session of its own (so every process it starts can be
// found and killed: mpirun gives each rank a process group of its own, but they stay in its
// session), on `ranks` ranks under mpirun when ranks > 1, its stdout and stderr written to
// `output` (replaced). Returns its pid, which is the session's id.
pid_t start_tandem(const std::vector<std::string>& arguments, const fs::path& output, int ranks = 1) {
  std::vector<std::string> words;
  if (ranks > 1) {
    words = {"mpirun", "-np", std::to_string(ranks), "--oversubscribe"};
    if (::geteuid() == 0) words.push_back("--allow-run-as-root");
  }
  words.push_back(TANDEM_BINARY);
  words.insert(words.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    // Leak checking off under mpirun in the sanitizer build (tests/support/run_tandem.hpp says why).
    if (ranks > 1) ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// The live (not zombie) processes of session `session`, from /proc.
std::vector<pid_t> session_processes(pid_t session) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // it ended meanwhile
    // pid (comm) state ppid pgrp session ...; comm may hold spaces: read after its last ')'.
    std::istringstream after(line.substr(line.rfind(')') + 2));
    char state = 0;
    pid_t parent = 0;
    pid_t group = 0;
    pid_t process_session = 0;
    after >> state >> parent >> group >> process_session;
    if (process_session == session && state != 'Z') found.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return found;
}

// SIGKILL to `leader` and to every process of its session, until none is left: what a node's
// failure or `kill -9` of a whole job does.
void kill_session(pid_t leader) {
  ::kill(leader, SIGKILL);  // first: before its setsid the session scan would not find it
  for (int attempt = 0; attempt < 10000; ++attempt) {
    const std::vector<pid_t> left = session_processes(leader);
    if (left.empty()) return;
    for (const pid_t pid : left) ::kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "processes of session " << leader << " outlived 10,000 SIGKILL rounds";
}

// Waits for `pid`; returns its exit code, or -SIGNAL when a signal ended it.
int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

struct CampaignSettings {
  int kills = 0;                  // SIGKILLs to deliver before the last start may run to the end
  std::int64_t iterations = 0;    // updates of the run (4 samples each), one checkpoint each
  int ranks = 1;                  // > 1: production ranks under mpirun, --use-distributed-optimizer
};

class KillCampaign : public testing::TinyTrainCli {
 protected:
  std::vector<std::string> run_arguments(const fs::path& save, std::int64_t iterations, int ranks = 1) const {
    std::vector<std::string> extra = {"--train-samples", std::to_string(4 * iterations), "--save-interval", "1",
                                      "--save", save.string(), "--load", save.string()};
    if (ranks > 1) extra.push_back("--use-distributed-optimizer");
    return tiny_train({"--engine", "production", "--device", "cpu"}, extra);
  }

  // Every complete checkpoint directory of `save` (iter_NNNNNNN, not a staging iter_N.tmp-XXXXXX)
  // loads; returns how many there are. Failures name the directory and the campaign's seed.
  int expect_every_checkpoint_loads(const fs::path& save, const std::string& where) const {
    int complete = 0;
    if (!fs::exists(save)) return 0;
    for (const auto& entry : fs::directory_iterator(save)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_directory() || !name.starts_with("iter_") || name.find(".tmp") != std::string::npos) continue;
      ++complete;
      try {
        checkpoint::load_checkpoint(entry.path());
      } catch (const std::exception& error) {
        ADD_FAILURE() << where << ": " << name << " does not load: " << error.what();
      }
    }
    return complete;
  }

  void run_campaign(const CampaignSettings& settings) {
    const char* seed_text = std::getenv("TANDEM_KILL_CAMPAIGN_SEED");
    const std::uint64_t seed = seed_text != nullptr ? std::stoull(seed_text) : 14;
    const std::string reproduce = "seed " + std::to_string(seed) + " (reproduce: TANDEM_KILL_CAMPAIGN_SEED=" +
                                  std::to_string(seed) + ")";
    const fs::path straight = root_ / "straight";
    const fs::path killed = root_ / "killed";
    const fs::path output = root_ / "output.txt";

    // The straight run, timed: the kills fall uniformly over one whole run's duration (startup,
    // iterations and saves), so most land in a save and some in the startup.
    const auto started = Clock::now();
    ASSERT_EQ(wait_for(start_tandem(run_arguments(straight, settings.iterations, settings.ranks), output,
                                    settings.ranks)), 0)
        << testing::bytes_of(output);
    const auto straight_duration = Clock::now() - started;
    const std::string final_name = checkpoint::iteration_directory_name(settings.iterations);

    std::mt19937_64 generator(seed);  // the campaign's one random stream: the kill delays
    std::uniform_int_distribution<std::int64_t> delay_us(
        0, std::chrono::duration_cast<std::chrono::microseconds>(straight_duration).count());
    // A start that outruns its kill finishes the run: that round ends with the comparison, and the
    // next round starts from an empty directory, until the kills are all delivered.
    std::optional<std::int64_t> tracker;  // the newest checkpoint seen so far in this round
    int kills = 0;
    int starts = 0;
    int rounds = 0;
    int kills_after_a_save = 0;   // the killed start had saved a checkpoint of its own first
    int kills_before_a_save = 0;  // it had not: the kill landed in its startup or its first iteration
    while (true) {
      ++starts;
      ASSERT_LE(starts, 3 * settings.kills + 10) << reproduce << ": too many starts";
      const pid_t pid = start_tandem(run_arguments(killed, settings.iterations, settings.ranks), output,
                                     settings.ranks);
      ASSERT_GT(pid, 0);
      if (kills < settings.kills) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(generator)));
        kill_session(pid);
      }
      const int exit_code = wait_for(pid);
      const std::string where = "after start " + std::to_string(starts) + ", " + reproduce;
      if (exit_code == -SIGKILL) {
        ++kills;
      } else if (exit_code != 0) {
        FAIL() << where << ": a start exited with " << exit_code << ":\n" << testing::bytes_of(output);
      }
      // Nothing lost: the tracker never moves back and names a checkpoint that loads.
      const std::optional<std::int64_t> now = checkpoint::read_latest_iteration(killed);
      if (tracker) {
        ASSERT_TRUE(now.has_value()) << where << ": the tracker disappeared (it named " << *tracker << ")";
        ASSERT_GE(*now, *tracker) << where << ": the tracker moved back";
      }
      if (now) {
        try {
          EXPECT_EQ(checkpoint::load_checkpoint(killed).counters.iteration, *now) << where;
        } catch (const std::exception& error) {
          FAIL() << where << ": the newest checkpoint (iteration " << *now << ") does not load: " << error.what();
        }
      }
      if (exit_code == -SIGKILL) ++(now != tracker ? kills_after_a_save : kills_before_a_save);
      tracker = now;
      expect_every_checkpoint_loads(killed, where);
      if (exit_code != 0) continue;
      // The round's end: the straight run's bytes and counters.
      ++rounds;
      ASSERT_EQ(now, std::optional<std::int64_t>(settings.iterations)) << where;
      EXPECT_EQ(testing::tensor_files_of(killed / final_name), testing::tensor_files_of(straight / final_name))
          << where;
      const auto counters = [&](const fs::path& save) {
        return nlohmann::json::parse(testing::bytes_of(save / final_name / "manifest.json"))["counters"];
      };
      EXPECT_EQ(counters(killed), counters(straight)) << where;
      if (kills >= settings.kills) break;
      fs::remove_all(killed);
      tracker.reset();
    }
    std::cout << "kill campaign: " << kills << " SIGKILLs (" << kills_after_a_save << " after the start had saved, "
              << kills_before_a_save << " before) over " << starts << " starts in " << rounds
              << " rounds, each ending on the straight run's bytes; " << reproduce << "\n";
  }
};

// A negative control of the comparison the campaign ends with: a run that trained other samples
// (another --seed) is told apart from the straight run.
TEST_F(KillCampaign, TheFinalComparisonTellsAnotherRunApart) {
  const fs::path straight = root_ / "straight";
  const fs::path other = root_ / "other";
  ASSERT_EQ(wait_for(start_tandem(run_arguments(straight, 3), root_ / "a.txt")), 0);
  auto other_arguments = run_arguments(other, 3);
  other_arguments.insert(other_arguments.end(), {"--seed", "7"});
  ASSERT_EQ(wait_for(start_tandem(other_arguments, root_ / "b.txt")), 0) << testing::bytes_of(root_ / "b.txt");
  EXPECT_NE(testing::tensor_files_of(other / checkpoint::iteration_directory_name(3)),
            testing::tensor_files_of(straight / checkpoint::iteration_directory_name(3)));
}

TEST_F(KillCampaign, AFewRandomKillsLoseNoCheckpointAndEndOnTheStraightRunsBytes) {
  run_campaign({.kills = 5, .iterations = 30});
}

TEST_F(KillCampaign, SoakAHundredRandomKillsLoseNoCheckpointAndEndOnTheStraightRunsBytes) {
  run_campaign({.kills = 100, .iterations = 30});
}

// The same on two ranks under mpirun with the distributed optimizer (each rank writes its shard):
// mpirun and both ranks are killed at once.
TEST_F(KillCampaign, SoakFortyRandomKillsOfTwoRanksLoseNoCheckpointAndEndOnTheStraightRunsBytes) {
  run_campaign({.kills = 40, .iterations = 30, .ranks = 2});
}

}  // namespace
}  // namespace tandem
