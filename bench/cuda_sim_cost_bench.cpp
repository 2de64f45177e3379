// What cuda-sim costs (docs/CUDA-SIM.md "Cost"): the production trainer's update
// on the demo model (ci/demo's: 2 layers, width 64, 4 heads in 2 groups, seq 64, 16 samples an
// update as 4 microbatches of 4; warmup 1 update, as the run is a few updates long) run by its cuda build on cuda-sim, against the same update on the
// host backend, printed as a ratio measured in the same run on the same CPU (goal: within 30x).
// Both are the equivalence harness's twins (equivalence/twin.hpp), one thread each: the host
// backend with --cpu-threads 1, cuda-sim running one block after another. Each update's time is
// the host clock around the twin's iteration (the trainer synchronizes its stream inside); the
// figures are medians of the timed updates after the warm-ups. The two runs start from the same
// initialization on the same samples, so their first losses agree within fp32's rounding (printed).
// Usage: cuda_sim_cost_bench [--warmups N] [--iterations N] [tandem train options ...]
//        (the options after the preset override it, the last value winning; --bf16 is one)
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench/run_options.hpp"
#include "core/args.hpp"
#include "equivalence/twin.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace {

using namespace tandem;

struct CostBench {
  int warmups = 1;
  int iterations = 3;
  std::vector<std::string> run_arguments;
};

RunConfig demo_config(const CostBench& bench) {
  std::vector<std::string> arguments = {
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
      "--num-query-groups", "2", "--seq-length", "64", "--vocab-size", "384", "--micro-batch-size", "4",
      "--global-batch-size", "16", "--lr", "1e-2", "--min-lr", "1e-3", "--lr-warmup-iters", "1",
      "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1", "--adam-beta2", "0.95",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.0"};
  arguments.insert(arguments.end(), bench.run_arguments.begin(), bench.run_arguments.end());
  arguments.emplace_back("--train-iters");
  arguments.push_back(std::to_string(bench.warmups + bench.iterations));
  return tandem::bench::run_config_from_options(arguments, "cuda_sim_cost_bench");
}

// The process's CPU time, every thread's (user and system): beside the wall clock, it shows what
// the update costs when other work shares the cores, and what the kernel (page faults, thread
// creation) takes of it.
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

struct Timing {
  double median_seconds = 0;
  double median_cpu_seconds = 0;
  double first_loss = 0;
};

Timing time_updates(const equivalence::TwinKind& kind, const equivalence::TwinSetup& setup, const CostBench& bench) {
  const auto built = std::chrono::steady_clock::now();
  const std::unique_ptr<equivalence::Twin> twin = kind.make(setup);
  std::printf("twin     %s: %s (built in %.2f s)\n", kind.name.c_str(), twin->description().c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - built).count());
  Timing timing;
  std::vector<double> seconds, cpu_seconds;
  for (int i = 0; i < bench.warmups + bench.iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_seconds();
    const IterationRecord record = twin->run_iteration();
    const double cpu = process_cpu_seconds() - cpu_start;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i == 0) timing.first_loss = record.loss;
    const bool timed = i >= bench.warmups;
    if (timed) seconds.push_back(elapsed);
    if (timed) cpu_seconds.push_back(cpu);
    std::printf("update   %-20s iteration %d (%s) loss %.6f | %.4f s, CPU %.4f s\n", kind.name.c_str(), i + 1,
                timed ? "timed" : "warm-up", record.loss, elapsed, cpu);
  }
  std::sort(seconds.begin(), seconds.end());
  std::sort(cpu_seconds.begin(), cpu_seconds.end());
  timing.median_seconds = seconds[seconds.size() / 2];
  timing.median_cpu_seconds = cpu_seconds[cpu_seconds.size() / 2];
  return timing;
}

int run(const CostBench& bench) {
  const RunConfig config = demo_config(bench);
  testing::StreamSamples samples = testing::tiny_production_samples();
  samples.seq_length = config.model.seq_length;
  const equivalence::TwinSetup setup{config, reference::SampleProvider(samples), {}, 0, 0, {}, 0};
  std::printf("model    %lld layers, d %lld, %lld heads in %lld groups, seq %lld, %lld samples an update as %lld "
              "microbatches of %lld, %s compute\n",
              static_cast<long long>(config.model.num_layers), static_cast<long long>(config.model.hidden_size),
              static_cast<long long>(config.model.num_attention_heads),
              static_cast<long long>(config.model.num_query_groups), static_cast<long long>(config.model.seq_length),
              static_cast<long long>(config.batch.global_batch_size),
              static_cast<long long>(config.microbatches_per_replica()),
              static_cast<long long>(config.batch.micro_batch_size), config.optimizer.bf16 ? "bf16" : "fp32");
  const Timing host = time_updates(equivalence::production_twin(false), setup, bench);
  const Timing sim = time_updates(equivalence::production_cuda_sim_twin(), setup, bench);
  const double ratio = sim.median_seconds / host.median_seconds;
  std::printf("loss     first update: host backend %.9g, cuda-sim %.9g (the same update in two builds)\n", host.first_loss,
              sim.first_loss);
  std::printf("cost     median update: host backend %.4f s, cuda-sim %.4f s: cuda-sim = %.1fx the host backend "
              "(goal <= 30x: %s)\n",
              host.median_seconds, sim.median_seconds, ratio, ratio <= 30.0 ? "met" : "NOT met");
  std::printf("cpu      median update's CPU time (every thread): host backend %.4f s, cuda-sim %.4f s: %.1fx\n",
              host.median_cpu_seconds, sim.median_cpu_seconds, sim.median_cpu_seconds / host.median_cpu_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CostBench bench;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string argument = argv[i];
      if ((argument == "--warmups" || argument == "--iterations") && i + 1 < argc) {
        const std::string text = argv[++i];
        int value = -1;
        const auto [end, status] = std::from_chars(text.data(), text.data() + text.size(), value);
        const int least = argument == "--warmups" ? 0 : 1;
        if (status != std::errc() || end != text.data() + text.size() || value < least) {
          std::fprintf(stderr, "error: %s = %s: must be an integer >= %d; fix: e.g. %s %d\n", argument.c_str(),
                       text.c_str(), least, argument.c_str(), least + 1);
          return 2;
        }
        (argument == "--warmups" ? bench.warmups : bench.iterations) = value;
      } else {
        bench.run_arguments.push_back(argument);
      }
    }
    return run(bench);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
  } catch (const ConfigError& error) {
    std::fprintf(stderr, "%s\n", format_issues(error.issues()).c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
  }
  return 2;
}
